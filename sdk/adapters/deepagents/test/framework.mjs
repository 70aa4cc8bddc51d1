// The framework version a test run uses: TUPPER_TEST_FRAMEWORK=lowest makes
// every require('deepagents') (the adapter's own included) load the lowest
// version the adapter supports (the devDependency alias deepagents-lowest);
// newest (the default) loads deepagents itself.  Returns the modules and
// the version really loaded.
import { createRequire } from 'node:module';
import Module from 'node:module';
import * as path from 'node:path';

const require = createRequire(import.meta.url);
const which = process.env.TUPPER_TEST_FRAMEWORK || 'newest';
if (which !== 'newest' && which !== 'lowest') throw new Error(`TUPPER_TEST_FRAMEWORK: newest or lowest, not ${which}`);
if (which === 'lowest') {
  const resolve = Module._resolveFilename;
  Module._resolveFilename = function (request, ...rest) {
    if (request === 'deepagents' || request.startsWith('deepagents/')) request = request.replace(/^deepagents/, 'deepagents-lowest');
    return resolve.call(this, request, ...rest);
  };
}

export const deepagents = require('deepagents');
export const adapter = require('../dist/index.js');
export const testing = require('@langchain/core/testing');
export const messages = require('@langchain/core/messages');
const pkgDir = path.dirname(path.dirname(require.resolve('deepagents')));
export const loaded = { which, version: require(path.join(pkgDir, 'package.json')).version };
