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
enforce). Subcommands:

  agents.py requests N OUT.jsonl           write throng's request file
  agents.py throng THRONG_BIN MODEL N      run throng, print the result line
  agents.py llama-server URL N SLOTS       drive a running llama-server, print the result line
"""

import concurrent.futures
import json
import re
import subprocess
import sys
import tempfile
import time
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


def run_throng(binary, model, n, weights="auto"):
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
    result("throng", n, seconds, generated, values, weights=weights,
           forced_tokens=int(g.group(2)) if g else None)


def run_llama_server(url, n, slots):
    def ask(a):
        body = {
            "messages": messages(a, n),
            "max_tokens": MAX_TOKENS,
            "temperature": 0.0,
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "decision", "schema": SCHEMA}},
        }
        req = urllib.request.Request(f"{url}/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=3600) as resp:
            reply = json.load(resp)
        return (reply["choices"][0]["message"]["content"],
                reply.get("usage", {}).get("completion_tokens", 0))

    ask(0)  # warm-up: loads the model pages and the template
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=n) as pool:
        replies = list(pool.map(ask, range(n)))
    seconds = time.perf_counter() - start
    result("llama-server", n, seconds, sum(t for _, t in replies),
           [parse(text) for text, _ in replies], slots=slots)


def main():
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "requests":
        write_requests(int(sys.argv[2]), sys.argv[3])
    elif cmd == "throng":
        run_throng(sys.argv[2], sys.argv[3], int(sys.argv[4]),
                   sys.argv[5] if len(sys.argv) > 5 else "auto")
    elif cmd == "llama-server":
        run_llama_server(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
