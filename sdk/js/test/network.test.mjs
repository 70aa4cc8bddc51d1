// Network rules from the SDK against a real daemon: create with rules, the
// box's resolver answers by them, updateNetwork, the decision log, getHost.
// Nothing leaves the host: the resolver answers allowed names with a
// synthetic address without any upstream lookup.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { startDaemon } from './daemon.mjs';
import { Sandbox, InvalidArgumentError, SandboxError } from '../dist/index.js';

let daemon;
let opts;
before(async () => {
  daemon = await startDaemon();
  opts = { socket: daemon.socket };
});
after(async () => {
  const r = await daemon.stop();
  assert.equal(r.code, 0);
});

test('create with network rules; the box resolves only what they allow; updateNetwork; the log', async () => {
  const sbx = await Sandbox.create({ ...opts, network: { allow: ['pypi.org', '*.pythonhosted.org:443'] } });
  try {
    let r = await sbx.commands.run('nslookup pypi.org 127.0.0.1', { timeoutMs: 30_000 });
    assert.match(r.stdout, /Address: 198\.18\./);
    r = await sbx.commands.run('nslookup example.com 127.0.0.1', { timeoutMs: 30_000 }).catch((e) => e.result ?? e);
    assert.match(r.stdout, /NXDOMAIN/);
    r = await sbx.commands.run('echo $HTTPS_PROXY');
    assert.equal(r.stdout, 'http://127.0.0.1:3128\n');
    await sbx.updateNetwork({ allow: ['example.com'] });
    r = await sbx.commands.run('nslookup example.com 127.0.0.1');
    assert.match(r.stdout, /Address: 198\.18\./);
    const log = await sbx.getNetworkLog();
    assert.ok(log.some((e) => e.action === 'deny' && e.via === 'dns' && e.host === 'example.com'));
    assert.ok(log.some((e) => e.action === 'allow' && e.host === 'pypi.org'));
    await assert.rejects(sbx.updateNetwork({ allow: ['pypi.org:0'] }), SandboxError);
  } finally {
    await sbx.kill();
  }
});

test('getHost forwards a port of the box to the host loopback', async () => {
  const sbx = await Sandbox.create(opts);
  try {
    await sbx.commands.run('mkdir -p srv && echo hi-from-box > srv/index.html && httpd -p 127.0.0.1:8080 -h /home/user/srv');
    const host = await sbx.getHost(8080);
    assert.match(host, /^127\.0\.0\.1:\d+$/);
    const body = await new Promise((resolve, reject) => {
      http.get(`http://${host}/index.html`, (res) => {
        let data = '';
        res.on('data', (c) => { data += c; });
        res.on('end', () => resolve(data));
      }).on('error', reject);
    });
    assert.equal(body, 'hi-from-box\n');
    assert.throws(() => sbx.getHost(0), InvalidArgumentError);
  } finally {
    await sbx.kill();
  }
});
