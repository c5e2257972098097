#!/usr/bin/env bash
# Peer benchmark: the same agent workload through throng and llama.cpp's llama-server, one
# after the other on this machine. Optional, not part of the tests (building llama-server takes
# a few minutes the first time).
#
#   benches/peer/run.sh [AGENTS] [SLOTS...]        defaults: 64 agents, slots 8 16 32
#
# Environment: THRONG_PEER_WEIGHTS (throng formats to run, default "auto f32"),
# THRONG_PEER_THREADS (threads for both engines, default: all cores), THRONG_PEER_ROUNDS
# (single-stream rounds, default 5), THRONG_PEER_HISTORY_STEPS (steps of the history
# workload, default 10), THRONG_PEER_HISTORY=0 (skip the history workload),
# THRONG_PEER_DECISIONS=0 (skip the decision workload and the single stream),
# THRONG_PEER_SEQUENTIAL=0 (skip the sequential agent loop: one agent's 32 structured calls
# one after another, through `throng api` and through llama-server with one slot),
# THRONG_PEER_BIN (a throng binary already built, instead of building one),
# THRONG_PEER_BASELINE (another throng binary, e.g. one built from main: every throng run is
# repeated with it, labelled throng-baseline, so that before and after come from one run),
# LLAMA_CPP_PYTHON_VERSION (the PyPI sdist that vendors llama.cpp, default 0.3.36),
# THRONG_PEER_ISA=avx2 (both engines limited to AVX2, FMA and F16C, as on the CPUs most
# people have, whatever this CPU has: llama.cpp built with only those, in a build folder of
# its own, and throng run with THRONG_MAX_CPU_ISA=avx2; default: all this CPU has).
#
# It builds throng (release), builds llama-server from the llama.cpp sources vendored in the
# PyPI sdist of llama-cpp-python (cmake from Debian's packages if missing), fetches SmolLM2-135M
# (GGUF Q4_1, the same file for both), then prints one JSON line per run and a summary table:
# decisions/s, generated tokens/s, the share of schema-valid replies, and single-stream decode
# tokens/s of each. Then the history workload (agents.py): the agents keep their chat over the
# steps (history = 10 turns), throng as one `generate --requests -` coprocess, llama-server with
# `cache_prompt` and one slot per agent (agent a pinned to slot a, each slot with context for
# every step; fewer slots only if that many do not start); a second table gives decisions/s
# overall and per step, the prefix-cache hit rate, each engine's peak memory and valid replies.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
AGENTS=${1:-64}
if (($# > 1)); then SLOTS=("${@:2}"); else SLOTS=(8 16 32); fi
WEIGHTS=(${THRONG_PEER_WEIGHTS:-auto f32})
THREADS=${THRONG_PEER_THREADS:-$(nproc)}
ROUNDS=${THRONG_PEER_ROUNDS:-5}
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
STEPS=${THRONG_PEER_HISTORY_STEPS:-10}
WORK=$ROOT/target/peer
PORT=${THRONG_PEER_PORT:-18080}
mkdir -p "$WORK"

if [[ -n ${THRONG_PEER_BIN:-} ]]; then
    THRONG=$THRONG_PEER_BIN
else
    echo "== building throng" >&2
    cargo build --release --quiet
    THRONG=$ROOT/target/release/throng
fi
# "label binary" pairs: the throng under test, then the baseline when one is given.
THRONGS=("throng $THRONG")
if [[ -n ${THRONG_PEER_BASELINE:-} ]]; then
    [[ -x $THRONG_PEER_BASELINE ]] || { echo "THRONG_PEER_BASELINE=$THRONG_PEER_BASELINE: not an executable" >&2; exit 1; }
    THRONGS+=("throng-baseline $THRONG_PEER_BASELINE")
fi
"$THRONG" fetch >&2
MODEL=$(find "${THRONG_CACHE:-$HOME/.cache/throng}" -name 'SmolLM2-135M-Instruct.Q4_1.gguf' | head -1)

ISA_CAP=${THRONG_PEER_ISA:-native}
case $ISA_CAP in
    native) ;;
    avx2) export THRONG_MAX_CPU_ISA=avx2 ;;
    *) echo "THRONG_PEER_ISA=$ISA_CAP: give avx2, or leave it unset" >&2; exit 1 ;;
esac
BUILD=$WORK/llama.cpp/build-$ISA_CAP
SERVER=$BUILD/bin/llama-server
if [[ ! -x $SERVER ]]; then
    echo "== building llama-server ($ISA_CAP) from llama-cpp-python $VERSION (a few minutes)" >&2
    command -v cmake >/dev/null || { apt-get update -qq && apt-get install -y -qq cmake; }
    if [[ ! -f $WORK/llama.cpp/CMakeLists.txt ]]; then
        # The sdist straight from the index's page: `pip download --no-binary :all:` would
        # build its build dependencies (CMake among them) from source only to read its
        # metadata.
        mkdir -p "$WORK/sdist"
        url=$(curl -sf https://pypi.org/simple/llama-cpp-python/ \
            | grep -o "https://[^\"]*/llama_cpp_python-$VERSION.tar.gz#sha256=[0-9a-f]*" | head -1)
        [[ -n $url ]] || { echo "llama-cpp-python $VERSION: no sdist on PyPI's index" >&2; exit 1; }
        curl -sfL -o "$WORK/sdist/llama_cpp_python-$VERSION.tar.gz" "${url%%#*}"
        echo "${url##*sha256=}  $WORK/sdist/llama_cpp_python-$VERSION.tar.gz" | sha256sum -c --quiet
        rm -rf "$WORK/src" && mkdir -p "$WORK/src"
        tar -xzf "$WORK"/sdist/llama_cpp_python-"$VERSION".tar.gz -C "$WORK/src"
        rm -rf "$WORK/llama.cpp"
        mv "$WORK/src/llama_cpp_python-$VERSION/vendor/llama.cpp" "$WORK/llama.cpp"
    fi
    # The instruction sets this CPU lists, named one by one rather than GGML_NATIVE: a native
    # build also compiles ggml's AMX kernels where the CPU lists AMX, and a virtual machine
    # that does not grant the tile state kills them with SIGILL at the first product.
    ISA=()
    if [[ $ISA_CAP == avx2 ]]; then
        ISA=(-DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON)
    else
        for flag in avx2:AVX2 bmi2:BMI2 fma:FMA f16c:F16C avx512f:AVX512 avx512vbmi:AVX512_VBMI \
            avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16; do
            grep -qw "${flag%%:*}" /proc/cpuinfo && ISA+=("-DGGML_${flag##*:}=ON")
        done
    fi
    cmake -S "$WORK/llama.cpp" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
        -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_SERVER=ON -DGGML_NATIVE=OFF "${ISA[@]}" >"$WORK/cmake-$ISA_CAP.log"
    cmake --build "$BUILD" --target llama-server llama-bench -j "$(nproc)" >"$WORK/build-$ISA_CAP.log"
fi

RESULTS=$WORK/results.jsonl
HISTORY=$WORK/history.jsonl
: >"$RESULTS"
: >"$HISTORY"
AGENT_PY=$ROOT/benches/peer/agents.py

# Waits for the llama-server of PID $1 to answer on $PORT; fails if it ends first.
wait_for_server() {
    for _ in $(seq 240); do
        curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && return 0
        kill -0 "$1" 2>/dev/null || return 1
        sleep 0.5
    done
    return 1
}

if [[ ${THRONG_PEER_DECISIONS:-1} != 0 ]]; then
echo "== throng: $AGENTS agents in one continuous batch" >&2
for t in "${THRONGS[@]}"; do
    for w in "${WEIGHTS[@]}"; do
        RAYON_NUM_THREADS=$THREADS python3 "$AGENT_PY" throng "${t#* }" "$MODEL" "$AGENTS" "$w" \
            "${t%% *}" | tee -a "$RESULTS"
    done
done

# The same requests over HTTP: `throng api`, AGENTS concurrent clients of one server.
for t in "${THRONGS[@]}"; do
    "${t#* }" api --help >/dev/null 2>&1 || continue
    for w in "${WEIGHTS[@]}"; do
        echo "== ${t%% *} api ($w): $AGENTS concurrent clients" >&2
        RAYON_NUM_THREADS=$THREADS "${t#* }" api --model "$MODEL" --weights "$w" \
            --addr "127.0.0.1:$PORT" --api-key bench >"$WORK/api.log" 2>&1 &
        PID=$!
        for _ in $(seq 240); do
            grep -q '^  base_url=' "$WORK/api.log" && break
            kill -0 "$PID" 2>/dev/null || break
            sleep 0.5
        done
        python3 "$AGENT_PY" throng-api "http://127.0.0.1:$PORT" "$AGENTS" bench "$MODEL" "$PID" \
            "${t%% *}-api-$w" | tee -a "$RESULTS" || true
        kill "$PID"
        wait "$PID" 2>/dev/null || true
    done
done

for slots in "${SLOTS[@]}"; do
    echo "== llama-server: $AGENTS agents over $slots slots" >&2
    "$SERVER" -m "$MODEL" -t "$THREADS" -np "$slots" -c $((slots * 512)) --port "$PORT" \
        --host 127.0.0.1 >"$WORK/server-$slots.log" 2>&1 &
    PID=$!
    wait_for_server "$PID" || true
    python3 "$AGENT_PY" llama-server "http://127.0.0.1:$PORT" "$AGENTS" "$slots" "$PID" | tee -a "$RESULTS" || true
    kill "$PID"
    wait "$PID" 2>/dev/null || true
done

echo "== single stream: 128 new tokens after a short prompt, $ROUNDS rounds" >&2
# The engines take turns, round after round (throng in each format, then llama-bench's tg128:
# 128 tokens decoded one at a time, one repetition), so that a machine whose speed drifts
# (a shared or virtual one) slows both alike; medians and the pairwise ratio are printed.
: >"$WORK/single.txt"
PROMPT="Write a long story about a lighthouse keeper."
for round in $(seq "$ROUNDS"); do
    for t in "${THRONGS[@]}"; do
        for w in "${WEIGHTS[@]}" q8_0; do
            rate=$("${t#* }" generate --model "$MODEL" --weights "$w" --prompt "$PROMPT" \
                --max-tokens 128 --threads "$THREADS" 2>&1 >/dev/null \
                | sed -n 's/.*decode [0-9]* tokens in [0-9.]*s (\([0-9.]*\) tokens\/s).*/\1/p')
            echo "$round ${t%% *}-$w ${rate:-nan}" | tee -a "$WORK/single.txt" >&2
        done
    done
    rate=$("$BUILD/bin/llama-bench" -m "$MODEL" -t "$THREADS" -p 0 -n 128 -r 1 \
        -o csv 2>/dev/null | tail -1 | awk -F, '{print $(NF-1)}' | tr -d '"')
    echo "$round llama.cpp ${rate:-nan}" | tee -a "$WORK/single.txt" >&2
done
python3 - "$WORK/single.txt" <<'EOF'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    round_, engine, rate = line.split()
    runs.setdefault(engine, {})[round_] = float(rate)
peer = runs.get("llama.cpp", {})
print("| single stream, 128 tokens | tokens/s, median | each round | vs llama.cpp, pairwise median |")
print("|---|---|---|---|")
for engine, rates in runs.items():
    ratios = [rates[r] / peer[r] for r in rates if r in peer and peer[r] > 0]
    ratio = f"{statistics.median(ratios):.2f}x" if engine != "llama.cpp" and ratios else "-"
    print(f"| {engine} | {statistics.median(rates.values()):.1f} | "
          f"{' '.join(f'{v:.0f}' for v in rates.values())} | {ratio} |")
EOF
fi

SEQUENTIAL=$WORK/sequential.jsonl
: >"$SEQUENTIAL"
if [[ ${THRONG_PEER_SEQUENTIAL:-1} != 0 ]]; then
    echo "== sequential: one agent, 32 structured calls one after another" >&2
    for t in "${THRONGS[@]}"; do
        for w in "${WEIGHTS[@]}"; do
            RAYON_NUM_THREADS=$THREADS "${t#* }" api --model "$MODEL" --weights "$w" \
                --addr "127.0.0.1:$PORT" --api-key bench >"$WORK/api-sequential.log" 2>&1 &
            PID=$!
            for _ in $(seq 240); do
                grep -q '^  base_url=' "$WORK/api-sequential.log" && break
                kill -0 "$PID" 2>/dev/null || break
                sleep 0.5
            done
            python3 "$AGENT_PY" sequential "http://127.0.0.1:$PORT" 32 "${t%% *}-api-$w" bench \
                "$MODEL" | tee -a "$SEQUENTIAL" || true
            kill "$PID"
            wait "$PID" 2>/dev/null || true
        done
    done
    "$SERVER" -m "$MODEL" -t "$THREADS" -np 1 -c 8192 --port "$PORT" --host 127.0.0.1 \
        >"$WORK/server-sequential.log" 2>&1 &
    PID=$!
    wait_for_server "$PID" || true
    python3 "$AGENT_PY" sequential "http://127.0.0.1:$PORT" 32 llama-server | tee -a "$SEQUENTIAL" || true
    kill "$PID"
    wait "$PID" 2>/dev/null || true
    python3 - "$SEQUENTIAL" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
peer = next((r["seconds"] for r in rows if r["engine"] == "llama-server"), None)
print("| sequential agent loop, 32 calls | seconds | per call, mean / p50 | generated tokens/s "
      "| valid | vs llama-server (time) |")
print("|---|---|---|---|---|---|")
for r in rows:
    ratio = f"{peer / r['seconds']:.2f}x" if peer and r["engine"] != "llama-server" else "-"
    print(f"| {r['engine']} | {r['seconds']:.2f} | {r['seconds_per_call']:.3f} / {r['p50_s']:.3f} "
          f"| {r['generated_tokens_per_s']:.0f} | {r['valid']}/{r['calls']} | {ratio} |")
EOF
fi

if [[ ${THRONG_PEER_HISTORY:-1} != 0 ]]; then
    echo "== history: $AGENTS agents, $STEPS steps, each keeping its chat (history = 10)" >&2
    for t in "${THRONGS[@]}"; do
        for w in "${WEIGHTS[@]}"; do
            RAYON_NUM_THREADS=$THREADS python3 "$AGENT_PY" history-throng "${t#* }" "$MODEL" \
                "$AGENTS" "$STEPS" "$w" "${t%% *}" | tee -a "$HISTORY" || true
        done
    done
    # llama-server's best set-up for it: one slot per agent, agent a pinned to slot a, so that
    # its previous prompt and reply are still in that slot's cache (cache_prompt), each slot
    # with context for the rules, 10 turns and a reply (~170 tokens a step; -c is split evenly
    # over the slots). Halved only if that many slots do not start (memory).
    CTX=$(((400 + STEPS * 180 + 255) / 256 * 256))
    slots=$AGENTS
    while :; do
        echo "== llama-server history: $slots slots of $CTX tokens, cache_prompt" >&2
        "$SERVER" -m "$MODEL" -t "$THREADS" -np "$slots" -c $((slots * CTX)) --port "$PORT" \
            --host 127.0.0.1 >"$WORK/server-history-$slots.log" 2>&1 &
        PID=$!
        wait_for_server "$PID" && break
        kill "$PID" 2>/dev/null || true
        wait "$PID" 2>/dev/null || true
        if ((slots == 1)); then
            echo "llama-server did not start: $WORK/server-history-$slots.log" >&2
            slots=0
            break
        fi
        echo "llama-server did not start with $slots slots; trying $((slots / 2))" >&2
        slots=$((slots / 2))
    done
    if ((slots > 0)); then
        # Its PID, for its peak memory (VmHWM), read before it is stopped.
        python3 "$AGENT_PY" history-llama-server "http://127.0.0.1:$PORT" "$AGENTS" "$STEPS" \
            "$slots" "$PID" | tee -a "$HISTORY" || true
        kill "$PID"
        wait "$PID" 2>/dev/null || true
    fi
fi

if [[ -s $RESULTS ]]; then
echo "== summary ($WORK/results.jsonl)" >&2
python3 - "$RESULTS" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
best = max((r["decisions_per_s"] for r in rows if r["engine"] == "llama-server"), default=None)
print("| engine | decisions/s | generated tokens/s | valid | p50 / p99 s | peak MiB |"
      + (" vs best llama-server |" if best else ""))
print("|---|---|---|---|---|---|" + ("---|" if best else ""))
for r in rows:
    if "weights" in r:
        name = f"{r['engine']} --weights {r['weights']}"
    elif "slots" in r:
        name = f"{r['engine']}, {r['slots']} slots"
    else:
        name = r["engine"]
    ratio = f" {r['decisions_per_s'] / best:.2f}x |" if best else ""
    latency = f"{r['p50_s']} / {r['p99_s']}" if "p50_s" in r else "-"
    print(f"| {name} | {r['decisions_per_s']:.2f} | {r['generated_tokens_per_s']:.0f} | "
          f"{r['valid']}/{r['agents']} | {latency} | {r.get('peak_mib') or '-'} |{ratio}")
EOF
fi

if [[ -s $HISTORY ]]; then
echo "== history summary ($HISTORY)" >&2
python3 - "$HISTORY" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
peer = next((r["decisions_per_s"] for r in rows if r["engine"] == "llama-server"), None)
print("| history workload | decisions/s | per step | prefix-cache hit rate | peak memory MB | valid |"
      " vs llama-server |")
print("|---|---|---|---|---|---|---|")
for r in rows:
    if r["engine"] == "llama-server":
        name = f"llama-server, {r['slots']} slots" + (", one per agent" if r["pinned_slots"] else "")
    else:
        name = f"{r['engine']} --weights {r['weights']}"
        name += " (a process per step)" if r["process_per_step"] else ""
    ratio = f"{r['decisions_per_s'] / peer:.2f}x" if peer and r["engine"] != "llama-server" else "-"
    peak = f"{r['peak_memory_mb']:.0f}" if r["peak_memory_mb"] else "?"
    print(f"| {name} | {r['decisions_per_s']:.2f} | "
          f"{' '.join(f'{v:.2f}' for v in r['decisions_per_s_by_step'])} | "
          f"{r['prefix_cache_hit_rate']:.0%} | {peak} | {r['valid']}/{r['decisions']} | {ratio} |")
EOF
fi
