#!/bin/sh
# The framework adapters' tests (docs/adapters.md), each on the newest and
# the lowest framework version it supports, against the SDK built from
# sdk/js.  Run from the repository's root, as tests/run.sh does.
# LangChain JS needs node 20 or newer (its engines), Mastra says 22.13 and
# runs on 20: on an older node (Debian 12's is 18.20) there is nothing the
# adapters can be tested with, and this says so instead of failing on it.
set -e
major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$major" -lt 20 ]; then
  echo "sdk/adapters: SKIPPED: node $(node --version) is older than the frameworks' floor (node 20)"
  exit 0
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
