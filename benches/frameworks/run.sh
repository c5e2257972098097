#!/usr/bin/env bash
# The field's simulation frameworks against `throng api`, outside the tests: a virtualenv of
# their own (target/frameworks/venv, from PyPI at the versions below), one `throng api` on
# SmolLM2, and examples.py, which makes each framework's typical call through its own OpenAI
# client and prints a line per framework: ok, or the error it met.
#
#   benches/frameworks/run.sh [THRONG_BIN]
#
# OASIS (camel-oasis) is not among them yet: it installs PyTorch and a recommender stack.
set -euo pipefail
cd "$(dirname "$0")/../.."
THRONG=${1:-target/release/throng}
VENV=target/frameworks/venv
PORT=${THRONG_FRAMEWORKS_PORT:-18123}
[[ -x $THRONG ]] || cargo build --release --bin throng
if [[ ! -x $VENV/bin/python ]]; then
    python3 -m venv "$VENV"
fi
"$VENV/bin/pip" install --quiet "gdm-concordia==2.1.0" "mesa-llm==0.2.0" "agentscope==2.0.11"
"$THRONG" api --addr "127.0.0.1:$PORT" --api-key frameworks >target/frameworks/api.log 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null || true' EXIT
for _ in $(seq 240); do
    grep -q '^  base_url=' target/frameworks/api.log && break
    kill -0 "$PID" 2>/dev/null || { cat target/frameworks/api.log >&2; exit 1; }
    sleep 0.5
done
"$VENV/bin/python" benches/frameworks/examples.py "http://127.0.0.1:$PORT/v1" frameworks \
    smollm2-135m-instruct 2>/dev/null
