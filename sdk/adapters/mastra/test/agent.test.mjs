// Mastra's real agent loop (an Agent with a Workspace of TupperSandbox and
// TupperFilesystem), driven by the AI SDK's scripted MockLanguageModelV2
// (ai/test): no LLM, no network.  The model makes the agent call the
// workspace's file, search and shell tools; the test checks what they did
// inside the real box, and what the agent was told back.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startDaemon } from '../../../js/test/daemon.mjs';
import { adapter, workspace, agent, scriptedModel, loaded } from './framework.mjs';

let daemon;
let sb;

before(async () => {
  daemon = await startDaemon();
  sb = new adapter.TupperSandbox({ socket: daemon.socket, policy: false });
});
after(async () => {
  try {
    await sb?._destroy();
  } finally {
    if (daemon) assert.equal((await daemon.stop()).code, 0);
  }
});

const T = {
  write: 'mastra_workspace_write_file',
  read: 'mastra_workspace_read_file',
  edit: 'mastra_workspace_edit_file',
  list: 'mastra_workspace_list_files',
  grep: 'mastra_workspace_grep',
  mkdir: 'mastra_workspace_mkdir',
  stat: 'mastra_workspace_file_stat',
  del: 'mastra_workspace_delete',
  exec: 'mastra_workspace_execute_command',
  output: 'mastra_workspace_get_process_output',
  kill: 'mastra_workspace_kill_process',
};

// what each tool told the agent, errors included, by tool name in call order
function results(r) {
  const out = {};
  const text = (v) => (typeof v === 'string' ? v : v && typeof v.value === 'string' ? v.value : JSON.stringify(v));
  for (const s of r.steps ?? []) {
    const parts = (s.content ?? []).filter((c) => c.type === 'tool-result' || c.type === 'tool-error');
    if (parts.length) {
      for (const c of parts) (out[c.toolName] ??= []).push(text(c.output ?? c.result ?? c.error));
      continue;
    }
    for (const t of s.toolResults ?? []) {
      const p = t.payload ?? t;
      (out[p.toolName] ??= []).push(text(p.result ?? p.output));
    }
  }
  return out;
}

test(`a Mastra Agent's workspace tools act inside the sandbox (@mastra/core ${loaded.version})`, async () => {
  const fsys = new adapter.TupperFilesystem({ sandbox: sb });
  const ws = new workspace.Workspace({ filesystem: fsys, sandbox: sb });
  await ws.init();
  const model = scriptedModel([
    [{ name: T.mkdir, args: { path: 'proj/src', recursive: true } }],
    [{ name: T.write, args: { path: 'proj/src/app.py', content: 'def main():\n    # TODO: greet\n    pass\n' } }],
    [{ name: T.read, args: { path: 'proj/src/app.py' } }],
    [{ name: T.edit, args: { path: 'proj/src/app.py', old_string: '# TODO: greet\n    pass', new_string: 'print("hello")' } }],
    [{ name: T.write, args: { path: 'proj/notes.md', content: 'TODO: docs\n' } }],
    [{ name: T.grep, args: { pattern: 'TODO', path: 'proj' } }],
    [{ name: T.list, args: { path: 'proj' } }],
    [{ name: T.exec, args: { command: 'cd proj && wc -l < src/app.py && id -un && echo built > build.log' } }],
    [{ name: T.exec, args: { command: 'echo started; sleep 60', background: true } }],
    [{ name: T.stat, args: { path: 'proj/build.log' } }],
    [{ name: T.del, args: { path: 'proj/notes.md' } }],
    // what the box refuses comes back to the agent as an error, and changes nothing
    [{ name: T.write, args: { path: '/etc/passwd', content: 'evil::0:0::/:/bin/sh\n' } }],
    [{ name: T.exec, args: { command: 'echo evil >> /etc/passwd' } }],
    'Done: app.py greets.',
  ]);
  const a = new agent.Agent({ id: 'tester', name: 'tester', instructions: 'You are a test agent.', model, workspace: ws });
  const r = await a.generate('make app.py greet', { maxSteps: 30 });
  assert.equal(r.text, 'Done: app.py greets.');

  // effects inside the box
  const files = sb.instance.files;
  assert.equal(await files.read('/home/user/proj/src/app.py'), 'def main():\n    print("hello")\n');
  assert.equal(await files.read('/home/user/proj/build.log'), 'built\n');
  assert.equal(await files.exists('/home/user/proj/notes.md'), false);
  assert.ok(!(await files.read('/etc/passwd', { user: 'root' })).includes('evil'));
  // the background command runs in the box until killed
  const bg = (await sb.instance.commands.list()).filter((p) => p.args.join(' ').includes('sleep 60'));
  assert.equal(bg.length, 1);

  const out = results(r);
  assert.match(out[T.write][0], /app\.py/);
  assert.match(out[T.read][0], /TODO: greet/);
  assert.match(out[T.grep][0], /notes\.md/);
  assert.doesNotMatch(out[T.grep][0], /app\.py/, 'the edit took the TODO away');
  assert.match(out[T.list][0], /src/);
  assert.match(out[T.list][0], /notes\.md/);
  assert.match(out[T.exec][0], /^2\nuser\n/);
  const pid = /PID: (\d+)/.exec(out[T.exec][1])?.[1];
  assert.equal(pid, String(bg[0].pid));
  assert.match(out[T.stat][0], /build\.log/);
  assert.match(out[T.write][2], /denied|permission|EACCES/i);
  assert.match(out[T.exec][2], /Permission denied/);
  assert.match(out[T.exec][2], /Exit code: 1/);

  // a second run: the agent reads the background process's output and kills it
  const model2 = scriptedModel([
    [{ name: T.output, args: { pid } }],
    [{ name: T.kill, args: { pid } }],
    'Stopped.',
  ]);
  const b = new agent.Agent({ id: 'tester2', name: 'tester2', instructions: 'You are a test agent.', model: model2, workspace: ws });
  const r2 = await b.generate('stop it', { maxSteps: 10 });
  assert.equal(r2.text, 'Stopped.');
  const out2 = results(r2);
  assert.match(out2[T.output][0], /started/);
  assert.match(out2[T.kill][0], new RegExp(pid));
  assert.deepEqual((await sb.instance.commands.list()).filter((p) => p.args.join(' ').includes('sleep 60')), []);
});
