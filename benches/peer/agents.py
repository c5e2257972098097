#!/usr/bin/env python3
"""The peer benchmark's workload and its two drivers (standard library only).

N energy-market agents, each a chat of a ~250-token system prompt shared by all and ~50 tokens
of its own state, answering a 4-field JSON schema with numeric bounds; greedy decoding, at
most 80 new tokens. The same requests go through:

- throng:       `throng generate --requests FILE` (one process, one continuous batch);
- llama-server: N concurrent HTTP requests to /v1/chat/completions with the schema as
                `response_format`, served by its `-np` parallel slots.

Each run prints one JSON line: decisions/s, generated tokens/s and the share of replies that
parse and satisfy the schema (including its bounds, which llama.cpp's grammar does not
enforce).

The history workload: the same N agents decide for STEPS steps and keep their chat, as a
simulation with `history = 10` does: agent a's step-s messages are the rules, then for each of
its last (at most) 10 steps that step's observation and the reply this engine gave to it, then
the new observation. Each engine's prompts are built from its own replies. throng serves it as
one `throng generate --requests -` coprocess (N requests written per step, N responses read),
so its prefix cache carries from step to step; llama-server as N concurrent requests per step
with `cache_prompt`, agent a pinned to slot a when there is a slot per agent. Each prints one
JSON line: decisions/s per step and overall, valid decisions over all steps, the prefix-cache
hit rate (cached prompt tokens over prompt tokens, from each response) per step and overall,
and the engine process's peak resident memory.

Subcommands:

  agents.py requests N OUT.jsonl                     write throng's request file
  agents.py throng THRONG_BIN MODEL N [WEIGHTS [LABEL]]
                                                     run throng, print the result line
  agents.py llama-server URL N SLOTS [PID]           drive a running llama-server
  agents.py throng-api URL N KEY MODEL [PID [LABEL]] drive a running `throng api` (PID: its
                                                     peak memory)
  agents.py history-throng THRONG_BIN MODEL N STEPS [WEIGHTS [LABEL]]
                                                     the history workload through throng
  agents.py history-llama-server URL N STEPS SLOTS [PID]
                                                     the history workload through a running
                                                     llama-server (PID: its peak memory)
  agents.py sequential URL CALLS LABEL [KEY MODEL]   one agent's loop through a running
                                                     OpenAI-compatible server: CALLS
                                                     structured calls one after another,
                                                     each with the agent's history

LABEL names the engine in the result line (default `throng`; run.sh's baseline binary runs as
`throng-baseline`). A throng binary whose `--requests -` does not read standard input (one
from before it did) runs the history workload as one `generate --requests FILE` process per
step instead, and its line says `"process_per_step": true`: no prefix cache carries over
steps then, and each step pays the model's loading (not counted in its time, which is the
time its summary line reports).
"""

import concurrent.futures
import json
import re
import resource
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

RULES = (
    "You are a company in a simulated regional energy market. Producers (oil and gas, "
    "renewable, nuclear, coal) generate electricity and sell it to utilities; utilities buy from the "
    "producers they are connected to and sell to consumers, whose demand moves a little every step and "
    "barely reacts to price. Every step you see your own state and your neighbours' state from the previous "
    "step, then decide at once with everyone else. Producing costs money per unit; energy you do not sell "
    "earns nothing. Raising capacity costs 50000 and adds 10 units of capacity but also raises your cost "
    "per unit by 10. Utilities pay producers the producer's price and charge consumers their own price; a "
    "regulator may cap the consumer price. Your goal is to maximise your profit over many steps without "
    "going bankrupt: a company whose resources fall below zero leaves the market. Answer with one JSON "
    "object and nothing else: production_change is how many units to add or remove, energy_price_change "
    "is how much to move your price, upgrade_capacity says whether to buy capacity this step, and reason "
    "is a few words on why. Be consistent with your persona and with the state of the market."
)

SCHEMA = {
    "type": "object",
    "properties": {
        "production_change": {"type": "integer", "minimum": -50, "maximum": 50},
        "energy_price_change": {"type": "number", "minimum": -10, "maximum": 10, "multipleOf": 0.1},
        "upgrade_capacity": {"type": "boolean"},
        "reason": {"type": "string", "maxLength": 40},
    },
    "required": ["production_change", "energy_price_change", "upgrade_capacity", "reason"],
    "additionalProperties": False,
}

MAX_TOKENS = 80

# Turns of its own chat an agent keeps in the history workload (a simulation's `history`).
HISTORY = 10


def state(a, n, step=1):
    kind = ["coal", "nuclear", "renewable", "oil and gas"][a % 4]
    return (
        f"Step {step}. You are company {a}, a {kind} producer. Resources {1000 + 37 * a + 11 * step}, "
        f"production {100 + a % 9}, capacity 200, price {50.0 + (a % 7) * 0.5:.1f}, cost {30 + a % 5}. "
        f"Neighbours: company {(a + 1) % n} sells at {48.0 + a % 5:.1f}, company {(a + 3) % n} sells at "
        f"{52.0 - a % 3:.1f}. Demand is {1000 + 13 * step} units."
    )


def messages(a, n):
    return [{"role": "system", "content": RULES}, {"role": "user", "content": state(a, n)}]


def valid(value):
    """Whether `value` satisfies SCHEMA (the subset of JSON Schema it uses)."""
    if not isinstance(value, dict) or set(value) != set(SCHEMA["required"]):
        return False
    p, e, u, r = (value[k] for k in SCHEMA["required"])
    if isinstance(p, bool) or not isinstance(p, int) or not -50 <= p <= 50:
        return False
    if isinstance(e, bool) or not isinstance(e, (int, float)) or not -10 <= e <= 10:
        return False
    if abs(round(e * 10) - e * 10) > 1e-6:
        return False
    return isinstance(u, bool) and isinstance(r, str) and len(r) <= 40


def parse(text):
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return None


def result(engine, n, seconds, generated, values, **extra):
    line = {
        "engine": engine,
        "agents": n,
        "seconds": round(seconds, 3),
        "decisions_per_s": round(n / seconds, 3),
        "generated_tokens_per_s": round(generated / seconds, 1),
        "valid": sum(valid(v) for v in values),
        "valid_share": round(sum(valid(v) for v in values) / n, 3),
    }
    line.update(extra)
    print(json.dumps(line), flush=True)


def write_requests(n, path):
    with open(path, "w") as f:
        for a in range(n):
            f.write(json.dumps({"messages": messages(a, n), "json_schema": SCHEMA,
                                "max_tokens": MAX_TOKENS, "temperature": 0.0}) + "\n")


def run_throng(binary, model, n, weights="auto", label="throng"):
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/requests.jsonl"
        write_requests(n, path)
        out = subprocess.run(
            [binary, "generate", "--model", model, "--weights", weights, "--requests", path],
            capture_output=True, text=True, check=True)
    replies = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    # The summary line: "throng: 64 requests in 12.34s (5.2/s); ... generated 2000 tokens (..."
    m = re.search(r"requests in ([0-9.]+)s", out.stderr)
    g = re.search(r"generated (\d+) tokens \(.*?(\d+) forced", out.stderr)
    seconds = float(m.group(1))
    generated = sum(r.get("generated_tokens", 0) for r in replies)
    values = [r.get("value") for r in replies]
    result(label, n, seconds, generated, values, weights=weights,
           forced_tokens=int(g.group(2)) if g else None)


def run_llama_server(url, n, slots, pid=None):
    run_openai(url, n, "llama-server", pid=pid, slots=slots)


def run_openai(url, n, label, key=None, model=None, pid=None, **extra):
    """N concurrent clients of an OpenAI-compatible server, one request each: decisions/s,
    valid replies, p50/p99 latency and (with PID) the server's peak memory."""
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"

    def ask(a):
        body = {
            "messages": messages(a, n),
            "max_tokens": MAX_TOKENS,
            "temperature": 0.0,
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "decision", "schema": SCHEMA}},
        }
        if model:
            body["model"] = model
        req = urllib.request.Request(f"{url}/v1/chat/completions", json.dumps(body).encode(),
                                     headers)
        asked = time.perf_counter()
        with urllib.request.urlopen(req, timeout=3600) as resp:
            reply = json.load(resp)
        return (reply["choices"][0]["message"]["content"],
                reply.get("usage", {}).get("completion_tokens", 0),
                time.perf_counter() - asked)

    ask(0)  # warm-up: loads the model pages and the template
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=n) as pool:
        replies = list(pool.map(ask, range(n)))
    seconds = time.perf_counter() - start
    latencies = sorted(t for _, _, t in replies)
    if pid:
        kib = peak_kib(pid)
        extra["peak_mib"] = round(kib / 1024, 1) if kib else None
    result(label, n, seconds, sum(t for _, t, _ in replies),
           [parse(text) for text, _, _ in replies],
           p50_s=round(latencies[len(latencies) // 2], 3),
           p99_s=round(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))], 3),
           **extra)


def history_messages(a, n, step, turns):
    """Agent a's messages at `step` (from 1): the rules, its last HISTORY turns (each the
    observation and this engine's reply to it), the new observation."""
    out = [{"role": "system", "content": RULES}]
    for s, reply in turns[-HISTORY:]:
        out += [{"role": "user", "content": state(a, n, s)},
                {"role": "assistant", "content": reply}]
    return out + [{"role": "user", "content": state(a, n, step)}]


def history_request(a, n, step, turns):
    return {"messages": history_messages(a, n, step, turns), "json_schema": SCHEMA,
            "max_tokens": MAX_TOKENS, "temperature": 0.0, "tag": f"{a}:{step}"}


def history_result(engine, n, steps, seconds, generated, values, cached, prompt,
                   peak_kib, **extra):
    """The history workload's line. `seconds`, `generated`, `cached`, `prompt`: one entry per
    step; `values`: every parsed decision."""
    total = sum(seconds)
    ok = sum(valid(v) for v in values)
    line = {
        "engine": engine,
        "workload": "history",
        "agents": n,
        "steps": steps,
        "history": HISTORY,
        "seconds": round(total, 3),
        "decisions_per_s": round(n * steps / total, 3),
        "decisions_per_s_by_step": [round(n / s, 3) for s in seconds],
        "generated_tokens_per_s": round(sum(generated) / total, 1),
        "valid": ok,
        "decisions": n * steps,
        "valid_share": round(ok / (n * steps), 3),
        "prefix_cache_hit_rate": round(sum(cached) / max(sum(prompt), 1), 3),
        "prefix_cache_hit_rate_by_step": [round(c / max(p, 1), 3) for c, p in zip(cached, prompt)],
        "prompt_tokens_by_step": [round(p / n) for p in prompt],
        "peak_memory_mb": round(peak_kib / 1024, 1) if peak_kib else None,
    }
    line.update(extra)
    print(json.dumps(line), flush=True)


def summary_hit_rate(stderr):
    """The prefix-cache hit rate of throng's summary line on stderr, as a share."""
    m = re.search(r"prefix-cache hits (\d+)%", stderr)
    return int(m.group(1)) / 100 if m else None


# A request unlike the workload's, answered before the clock starts: the model is loaded and
# its pages touched, as llama-server's are once its health check answers.
WARM_UP = {"messages": [{"role": "user", "content": "Say OK."}], "max_tokens": 1,
           "temperature": 0.0, "tag": "warm-up"}


def run_history_throng(binary, model, n, steps, weights="auto", label="throng"):
    cmd = [binary, "generate", "--model", model, "--weights", weights, "--requests", "-",
           "--max-tokens", str(MAX_TOKENS)]
    child = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    child.stdin.write(json.dumps(WARM_UP) + "\n")
    child.stdin.flush()
    if not child.stdout.readline():
        # No response while stdin is open: this binary reads `-` as a file name (or failed).
        err = child.communicate()[1]
        if child.returncode and "opening -" in err:
            return run_history_throng_per_step(binary, model, n, steps, weights, label)
        sys.exit(f"{label}: {' '.join(cmd)} failed:\n{err}")
    turns = [[] for _ in range(n)]
    seconds, generated, cached, prompt, values = [], [], [], [], []
    for step in range(1, steps + 1):
        start = time.perf_counter()
        for a in range(n):
            child.stdin.write(json.dumps(history_request(a, n, step, turns[a])) + "\n")
        child.stdin.flush()
        lines = [child.stdout.readline() for _ in range(n)]
        seconds.append(time.perf_counter() - start)
        if not all(lines):
            child.kill()
            sys.exit(f"{label}: it ended in step {step}:\n{child.stderr.read()}")
        replies = [json.loads(line) for line in lines]
        step_stats(replies, turns, step, generated, cached, prompt, values)
    child.stdin.close()
    err = child.stderr.read()
    child.wait()
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB on Linux
    history_result(label, n, steps, seconds, generated, values, cached, prompt, peak,
                   weights=weights, process_per_step=False,
                   summary_prefix_cache_hit_rate=summary_hit_rate(err),
                   exit_code=child.returncode)


def step_stats(replies, turns, step, generated, cached, prompt, values):
    """Adds one step of throng's response lines (in agent order) to the tallies, and each
    reply to its agent's history."""
    generated.append(sum(r.get("generated_tokens", 0) for r in replies))
    cached.append(sum(r.get("cached_tokens", 0) for r in replies))
    prompt.append(sum(r.get("prompt_tokens", 0) for r in replies))
    for a, r in enumerate(replies):
        values.append(r.get("value"))
        turns[a].append((step, r.get("text") or ""))


def run_history_throng_per_step(binary, model, n, steps, weights, label):
    turns = [[] for _ in range(n)]
    seconds, generated, cached, prompt, values, rates = [], [], [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/requests.jsonl"
        for step in range(1, steps + 1):
            with open(path, "w") as f:
                for a in range(n):
                    f.write(json.dumps(history_request(a, n, step, turns[a])) + "\n")
            out = subprocess.run(
                [binary, "generate", "--model", model, "--weights", weights, "--requests", path,
                 "--max-tokens", str(MAX_TOKENS)], capture_output=True, text=True)
            replies = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
            if len(replies) != n:
                sys.exit(f"{label}: step {step}: {len(replies)} of {n} replies:\n{out.stderr}")
            seconds.append(float(re.search(r"requests in ([0-9.]+)s", out.stderr).group(1)))
            rates.append(summary_hit_rate(out.stderr))
            step_stats(replies, turns, step, generated, cached, prompt, values)
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    history_result(label, n, steps, seconds, generated, values, cached, prompt, peak,
                   weights=weights, process_per_step=True,
                   summary_prefix_cache_hit_rate_by_step=rates)


def peak_kib(pid):
    """VmHWM of a running process, in KiB."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def run_history_llama_server(url, n, steps, slots, pid=None):
    # One slot per agent: agent a's requests go to slot a, whose KV cache still holds its
    # previous prompt and reply. Fewer slots than agents: llama-server picks the idle slot
    # whose cache shares the longest prefix (then the least recently used).
    pinned = slots >= n

    def ask(body):
        req = urllib.request.Request(f"{url}/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=3600) as resp:
                return json.load(resp)
        except urllib.error.HTTPError as e:
            return {"error": e.read().decode(errors="replace")}

    def decide(a, step, turns):
        body = {
            "messages": history_messages(a, n, step, turns),
            "max_tokens": MAX_TOKENS,
            "temperature": 0.0,
            "cache_prompt": True,
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "decision", "schema": SCHEMA}},
        }
        if pinned:
            body["id_slot"] = a
        return ask(body)

    ask({k: v for k, v in WARM_UP.items() if k != "tag"})
    turns = [[] for _ in range(n)]
    seconds, generated, cached, prompt, values = [], [], [], [], []
    errors = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=n) as pool:
        for step in range(1, steps + 1):
            start = time.perf_counter()
            replies = list(pool.map(lambda a: decide(a, step, turns[a]), range(n)))
            seconds.append(time.perf_counter() - start)
            step_generated = step_cached = step_prompt = 0
            for a, reply in enumerate(replies):
                if "error" in reply:
                    errors += 1
                    text = ""
                else:
                    text = reply["choices"][0]["message"]["content"]
                    usage = reply.get("usage", {})
                    step_generated += usage.get("completion_tokens", 0)
                    # timings.cache_n: prompt tokens taken from the slot's cache; prompt_n:
                    # those evaluated (at least one, even on a full hit).
                    t = reply.get("timings")
                    if t:
                        step_cached += t["cache_n"]
                        step_prompt += t["cache_n"] + t["prompt_n"]
                    else:
                        step_cached += usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)
                        step_prompt += usage.get("prompt_tokens", 0)
                values.append(parse(text))
                turns[a].append((step, text))
            generated.append(step_generated)
            cached.append(step_cached)
            prompt.append(step_prompt)
    history_result("llama-server", n, steps, seconds, generated, values, cached, prompt,
                   peak_kib(pid) if pid else None, slots=slots, pinned_slots=pinned,
                   errors=errors)


def run_sequential(url, calls, label, key=None, model=None):
    """One agent calling the server CALLS times, each call waiting for the one before (an
    AutoGen or pydantic-ai loop): its prompt is the rules, its last HISTORY turns and the new
    observation, its reply held to the schema. Prints seconds in all and per call."""
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"

    def ask(body):
        if model:
            body["model"] = model
        req = urllib.request.Request(f"{url}/v1/chat/completions", json.dumps(body).encode(),
                                     headers)
        with urllib.request.urlopen(req, timeout=3600) as resp:
            return json.load(resp)

    ask({k: v for k, v in WARM_UP.items() if k != "tag"})
    turns, values, generated, times = [], [], 0, []
    for step in range(1, calls + 1):
        start = time.perf_counter()
        reply = ask({
            "messages": history_messages(0, 1, step, turns),
            "max_tokens": MAX_TOKENS,
            "temperature": 0.0,
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "decision", "schema": SCHEMA}},
        })
        times.append(time.perf_counter() - start)
        text = reply["choices"][0]["message"]["content"]
        generated += reply.get("usage", {}).get("completion_tokens", 0)
        values.append(parse(text))
        turns.append((step, text))
    total = sum(times)
    print(json.dumps({
        "engine": label,
        "workload": "sequential",
        "calls": calls,
        "seconds": round(total, 3),
        "seconds_per_call": round(total / calls, 4),
        "p50_s": round(sorted(times)[calls // 2], 4),
        "generated_tokens_per_s": round(generated / total, 1),
        "valid": sum(valid(v) for v in values),
    }), flush=True)


def main():
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "requests":
        write_requests(int(sys.argv[2]), sys.argv[3])
    elif cmd == "throng":
        run_throng(sys.argv[2], sys.argv[3], int(sys.argv[4]), *sys.argv[5:7])
    elif cmd == "llama-server":
        run_llama_server(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]),
                         *(int(p) for p in sys.argv[5:6]))
    elif cmd == "throng-api":
        pid = int(sys.argv[6]) if len(sys.argv) > 6 else None
        label = sys.argv[7] if len(sys.argv) > 7 else "throng-api"
        run_openai(sys.argv[2], int(sys.argv[3]), label, key=sys.argv[4], model=sys.argv[5],
                   pid=pid, transport="http")
    elif cmd == "history-throng":
        run_history_throng(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]),
                           *sys.argv[6:8])
    elif cmd == "history-llama-server":
        run_history_llama_server(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]),
                                 int(sys.argv[5]), *(int(p) for p in sys.argv[6:7]))
    elif cmd == "sequential":
        run_sequential(sys.argv[2], int(sys.argv[3]), sys.argv[4], *sys.argv[5:7])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
