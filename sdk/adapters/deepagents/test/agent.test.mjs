// deepagents' real agent loop (createDeepAgent) over a tupper sandbox,
// driven by LangChain's scripted fake chat model (fakeModel from
// @langchain/core/testing): no LLM, no network.  The model makes the agent
// call its file, shell and search tools; the test checks what they did
// inside the real box, and what the agent was told back.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startDaemon } from '../../../js/test/daemon.mjs';
import { adapter, deepagents, testing, messages, loaded } from './framework.mjs';

let daemon;
let be;

before(async () => {
  daemon = await startDaemon();
  be = await adapter.createTupperBackend({ socket: daemon.socket, policy: false });
});
after(async () => {
  try {
    await be?.close();
  } finally {
    if (daemon) assert.equal((await daemon.stop()).code, 0);
  }
});

function toolReplies(result) {
  const out = {};
  for (const m of result.messages) {
    if (messages.ToolMessage.isInstance(m)) (out[m.name] ??= []).push(typeof m.content === 'string' ? m.content : m.content.map((c) => c.text ?? '').join(''));
  }
  return out;
}

test(`createDeepAgent's tools act inside the sandbox (deepagents ${loaded.version})`, async () => {
  const dir = '/home/user/proj';
  const model = testing.fakeModel()
    .respondWithTools([{ name: 'write_file', args: { file_path: `${dir}/app.py`, content: 'def main():\n    # TODO: greet\n    pass\n' } }])
    .respondWithTools([{ name: 'execute', args: { command: `cd ${dir} && wc -l < app.py && id -un && echo built > build.log` } }])
    .respondWithTools([{ name: 'grep', args: { pattern: 'TODO', path: dir } }])
    .respondWithTools([{ name: 'edit_file', args: { file_path: `${dir}/app.py`, old_string: '# TODO: greet\n    pass', new_string: 'print("hello")' } }])
    .respondWithTools([{ name: 'glob', args: { pattern: '**/*.py', path: dir } }])
    .respondWithTools([{ name: 'ls', args: { path: dir } }])
    .respondWithTools([{ name: 'read_file', args: { file_path: `${dir}/app.py` } }])
    .respondWithTools([{ name: 'execute', args: { command: `python3 ${dir}/app.py || sh -c 'echo no python; exit 5'` } }])
    // what the box refuses comes back to the agent as an error, and changes nothing
    .respondWithTools([{ name: 'write_file', args: { file_path: '/etc/passwd', content: 'evil::0:0::/:/bin/sh\n' } }])
    .respondWithTools([{ name: 'execute', args: { command: 'echo evil >> /etc/passwd' } }])
    .respond(new messages.AIMessage('Done: app.py greets.'));
  const agent = deepagents.createDeepAgent({ model, backend: be, systemPrompt: 'You are a test agent.' });
  const result = await agent.invoke({ messages: [new messages.HumanMessage('make app.py greet')] }, { recursionLimit: 60 });

  assert.equal(result.messages.at(-1).content, 'Done: app.py greets.');
  assert.equal(model.callCount, 11, 'the model was asked once per step');
  // effects inside the box
  assert.equal(await be.sandbox.files.read(`${dir}/app.py`), 'def main():\n    print("hello")\n');
  assert.equal(await be.sandbox.files.read(`${dir}/build.log`), 'built\n');
  const passwd = await be.sandbox.files.read('/etc/passwd', { user: 'root' });
  assert.ok(!passwd.includes('evil'));
  // what the tools told the agent
  const r = toolReplies(result);
  assert.match(r.write_file[0], /app\.py/);
  assert.match(r.execute[0], /^3\nuser\n/);
  assert.match(r.execute[0], /exit code 0|succeeded/i);
  assert.match(r.grep[0], /app\.py/);
  assert.match(r.edit_file[0], /app\.py/);
  assert.match(r.glob[0], /app\.py/);
  assert.match(r.ls[0], /app\.py/);
  assert.match(r.ls[0], /build\.log/);
  assert.match(r.read_file[0], /print\("hello"\)/);
  assert.match(r.execute[1], /no python[\s\S]*5/);
  assert.match(r.write_file[1], /permission_denied|Error|denied/i);
  assert.match(r.execute[2], /Permission denied/);
  assert.match(r.execute[2], /exit code 1|failed/i);
});
