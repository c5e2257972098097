#!/usr/bin/env bash
# The field's simulation frameworks against `throng api`, outside the tests: a virtualenv of
# their own (target/frameworks/venv, from PyPI at the versions below), one `throng api` on
# SmolLM2, and examples.py, which makes each framework's typical call through its own OpenAI
# client and prints a line per framework: ok, or the error it met.
#
#   benches/frameworks/run.sh [THRONG_BIN]
#
# LangChain, instructor, pydantic-ai, AutoGen and DSPy share a third (target/frameworks/
# agents-venv). OASIS (camel-oasis) has a virtualenv of its own (target/frameworks/oasis-venv) without
# PyTorch: camel-oasis without its dependencies (PyTorch, sentence-transformers, unstructured,
# test tools...), camel-ai at the version it pins, and what its agent, platform and
# environment import; examples.py stands in for the embedding recommenders' libraries.
set -euo pipefail
cd "$(dirname "$0")/../.."
THRONG=${1:-target/release/throng}
VENV=target/frameworks/venv
OASIS_VENV=target/frameworks/oasis-venv
AGENTS_VENV=target/frameworks/agents-venv
PORT=${THRONG_FRAMEWORKS_PORT:-18123}
[[ -x $THRONG ]] || cargo build --release --bin throng
if [[ ! -x $VENV/bin/python ]]; then
    python3 -m venv "$VENV"
fi
"$VENV/bin/pip" install --quiet "gdm-concordia==2.1.0" "mesa-llm==0.2.0" "agentscope==2.0.11"
if [[ ! -x $OASIS_VENV/bin/python ]]; then
    python3 -m venv "$OASIS_VENV"
fi
# camel-ai 0.2.78 asks for mcp>=1.3.0 but imports mcp.server.FastMCP, which mcp 2.3 no longer
# has (and mcp 1.16 fails on pydantic 2.14): the last mcp 1.
"$OASIS_VENV/bin/pip" install --quiet "camel-ai==0.2.78" "mcp==1.30.0" "pillow==10.3.0" \
    "pandas==2.2.2" "igraph==0.11.6" "neo4j==5.23.0" "tqdm==4.70.1"
"$OASIS_VENV/bin/pip" install --quiet --no-deps "camel-oasis==0.2.5"
# The agent libraries (structured outputs and tool calls through their own OpenAI clients) in a
# virtualenv of their own: their pins of openai and pydantic differ from the simulation
# frameworks'.
if [[ ! -x $AGENTS_VENV/bin/python ]]; then
    python3 -m venv "$AGENTS_VENV"
fi
"$AGENTS_VENV/bin/pip" install --quiet "langchain-openai==1.8.1" "instructor==1.17.0" \
    "pydantic-ai-slim[openai]==2.38.0" "autogen-agentchat==0.7.5" "autogen-ext[openai]==0.7.5" \
    "dspy==3.4.1"
"$THRONG" api --addr "127.0.0.1:$PORT" --api-key frameworks >target/frameworks/api.log 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null || true' EXIT
for _ in $(seq 240); do
    grep -q '^  base_url=' target/frameworks/api.log && break
    kill -0 "$PID" 2>/dev/null || { cat target/frameworks/api.log >&2; exit 1; }
    sleep 0.5
done
"$VENV/bin/python" benches/frameworks/examples.py "http://127.0.0.1:$PORT/v1" frameworks \
    smollm2-135m-instruct concordia mesa-llm agentscope 2>/dev/null
"$OASIS_VENV/bin/python" benches/frameworks/examples.py "http://127.0.0.1:$PORT/v1" frameworks \
    smollm2-135m-instruct oasis 2>/dev/null
"$AGENTS_VENV/bin/python" benches/frameworks/examples.py "http://127.0.0.1:$PORT/v1" frameworks \
    smollm2-135m-instruct langchain instructor pydantic-ai autogen dspy 2>/dev/null
