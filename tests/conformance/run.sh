#!/usr/bin/env bash
# The MCP conformance suite (@modelcontextprotocol/conformance) against a real binlens server.
#   0.2.x line: the 2026-07-28 (stateless) scenarios; latest 0.1.x: the handshake-era scenarios.
# Scenarios that need the suite's fixture tools/prompts/resources (which binlens, serving only its
# registry, does not have) are listed with the reason in not-applicable.yml and not run; the few
# fixture-only checks inside scenarios we do run are in expected-failures.yml.
# Needs Node >= 22: installed from npm into build/conformance (no system change).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
PY=${PY:-$ROOT/.venv/bin/python}
TOOLS=$ROOT/build/conformance
NEW=${CONFORMANCE_NEW:-0.2.0-alpha.12}
OLD=${CONFORMANCE_OLD:-0.1.16}
HERE=$ROOT/tests/conformance

SCENARIOS_2026=(server-stateless http-header-validation caching dns-rebinding-protection
                sep-2164-resource-not-found tools-list resources-list prompts-list)
SCENARIOS_HANDSHAKE=(server-initialize ping tools-list resources-list prompts-list dns-rebinding-protection)

install() {  # install PREFIX PACKAGES...
  local prefix=$1; shift
  if [[ ! -f $prefix/.done-$(echo "$*" | tr ' /@' '___') ]]; then
    mkdir -p "$prefix"
    npm install --silent --no-audit --no-fund --prefix "$prefix" "$@" >/dev/null
    touch "$prefix/.done-$(echo "$*" | tr ' /@' '___')"
  fi
}
install "$TOOLS/node" node@22
install "$TOOLS/new" "@modelcontextprotocol/conformance@$NEW"
install "$TOOLS/old" "@modelcontextprotocol/conformance@$OLD"
export PATH=$TOOLS/node/node_modules/.bin:$PATH
node --version | grep -q '^v2[2-9]\|^v[3-9][0-9]' || { echo "node >= 22 needed, got $(node --version)"; exit 1; }

make -s build/sample >/dev/null
PORT=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
HOME_DIR=$(mktemp -d)
BINLENS_HOME=$HOME_DIR PYTHONPATH=$ROOT/src "$PY" -m binlens serve build/sample --port "$PORT" >"$HOME_DIR/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true; wait $SERVER 2>/dev/null || true; rm -rf "$HOME_DIR"' EXIT
for _ in $(seq 1 100); do
  "$PY" -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$PORT/healthz', timeout=1)" 2>/dev/null && break
  sleep 0.2
done
URL=http://127.0.0.1:$PORT/mcp

fail=0
run() {  # run CONFORMANCE-BIN LABEL SCENARIO [extra args]
  local bin=$1 label=$2 scenario=$3; shift 3
  local out
  if out=$(node "$bin" server --url "$URL" --scenario "$scenario" "$@" 2>&1); then
    echo "ok   $label $scenario: $(echo "$out" | grep -E '^Passed:' | tail -1)"
  else
    echo "FAIL $label $scenario"
    echo "$out" | grep -E 'FAILURE|Error:|Unexpected|Passed:' | head -20
    fail=1
  fi
}
NEWBIN=$TOOLS/new/node_modules/@modelcontextprotocol/conformance/dist/index.js
OLDBIN=$TOOLS/old/node_modules/@modelcontextprotocol/conformance/dist/index.js
for s in "${SCENARIOS_2026[@]}"; do
  run "$NEWBIN" "$NEW" "$s" --expected-failures "$HERE/expected-failures.yml"
done
for s in "${SCENARIOS_HANDSHAKE[@]}"; do
  run "$OLDBIN" "$OLD" "$s"
done
if ((fail)); then
  echo "conformance: failures (server log: $(tail -5 "$HOME_DIR/server.log"))"
  exit 1
fi
echo "conformance: all applicable scenarios pass"
