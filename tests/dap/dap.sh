#!/bin/bash
# tests/dap/dap.sh SHMAP - the debug adapter (`shmap --dap`, shmap(1) DEBUG
# ADAPTER) driven by VS Code's own test client, @vscode/debugadapter-
# testsupport's DebugClient, through tests/dap/session.js: 10 runs of the
# sessions (3 in a sanitizer build; DAP_RUNS to change it) must pass and
# give the same events and values.  Skipped (status 77) where node or npm
# is missing.  The client's packages are those package-lock.json pins,
# installed with `npm ci` beside this script or, when the build is
# elsewhere, under the build's tests/dap; node_modules is never committed.
set -u
shmap=${1:?usage: dap.sh SHMAP}
scale=${SHMAP_TEST_SCALE:-1}   # time limits grow in sanitizer builds (run-tests.sh)
here=$(cd "$(dirname "$0")" && pwd)
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "SKIP tests/dap: node and npm are not installed (apt-get install nodejs npm)"
  exit 77
fi
client=@vscode/debugadapter-testsupport
if [ -d "$here/node_modules/$client" ]; then
  modules=$here/node_modules
else
  dir=$(cd "$(dirname "$shmap")" && pwd)/tests/dap
  mkdir -p "$dir"
  if [ ! -d "$dir/node_modules/$client" ] || ! cmp -s "$here/package-lock.json" "$dir/package-lock.json"; then
    [ "$dir" -ef "$here" ] || cp "$here/package.json" "$here/package-lock.json" "$dir/"
    if ! (cd "$dir" && timeout $((300 * scale)) npm ci --no-audit --no-fund >npm.log 2>&1); then
      echo "FAIL tests/dap: npm ci in $dir failed:"
      tail -n 20 "$dir/npm.log"
      exit 1
    fi
  fi
  modules=$dir/node_modules
fi
# 10 runs; 3 in a sanitizer build, several times slower
runs=${DAP_RUNS:-$([ "$scale" -eq 1 ] && echo 10 || echo 3)}
NODE_PATH=$modules timeout $((120 * scale)) node "$here/session.js" "$shmap" "$runs"
