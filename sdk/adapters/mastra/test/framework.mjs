// The framework version a test run uses: TUPPER_TEST_FRAMEWORK=lowest makes
// every require('@mastra/core/...') (the adapter's own included) load the
// lowest version the adapter supports (the devDependency alias
// mastra-core-lowest); newest (the default) loads @mastra/core itself.
// Returns the modules and the version really loaded.
import { createRequire } from 'node:module';
import Module from 'node:module';
import * as fs from 'node:fs';
import * as path from 'node:path';

const require = createRequire(import.meta.url);
const which = process.env.TUPPER_TEST_FRAMEWORK || 'newest';
if (which !== 'newest' && which !== 'lowest') throw new Error(`TUPPER_TEST_FRAMEWORK: newest or lowest, not ${which}`);
const pkg = which === 'lowest' ? 'mastra-core-lowest' : '@mastra/core';
if (which === 'lowest') {
  const resolve = Module._resolveFilename;
  Module._resolveFilename = function (request, ...rest) {
    if (request === '@mastra/core' || request.startsWith('@mastra/core/')) request = request.replace(/^@mastra\/core/, 'mastra-core-lowest');
    return resolve.call(this, request, ...rest);
  };
}

export const workspace = require('@mastra/core/workspace');
export const agent = require('@mastra/core/agent');
export const adapter = require('../dist/index.js');
export const aiTest = require('ai/test');
const pkgJson = path.join(path.dirname(require.resolve(`${pkg}/package.json`)), 'package.json');
export const loaded = { which, version: JSON.parse(fs.readFileSync(pkgJson, 'utf8')).version };

/**
 * AI SDK's MockLanguageModelV2 scripted: each step is a list of tool calls
 * ({name, args}) or a final text; the model answers the agent's calls in
 * that order, streaming or not.
 */
export function scriptedModel(steps) {
  let n = 0;
  const usage = { inputTokens: 1, outputTokens: 1, totalTokens: 2 };
  const parts = (step) => {
    if (typeof step === 'string') return { content: [{ type: 'text', text: step }], finishReason: 'stop' };
    return {
      content: step.map((c) => ({ type: 'tool-call', toolCallId: `call-${++n}`, toolName: c.name, input: JSON.stringify(c.args) })),
      finishReason: 'tool-calls',
    };
  };
  const generated = steps.map((s) => ({ ...parts(s), usage, warnings: [] }));
  const streamed = generated.map((g) => ({
    stream: aiTest.simulateReadableStream({
      chunks: [
        { type: 'stream-start', warnings: [] },
        ...g.content.flatMap((c) =>
          c.type === 'text'
            ? [{ type: 'text-start', id: 't' }, { type: 'text-delta', id: 't', delta: c.text }, { type: 'text-end', id: 't' }]
            : [c]),
        { type: 'finish', finishReason: g.finishReason, usage },
      ],
    }),
  }));
  return new aiTest.MockLanguageModelV2({ doGenerate: generated, doStream: streamed });
}
