"""What the Python layer costs: the same 64 constrained requests through `Engine.decide` and
through `throng generate --requests`, taking turns, each on a fresh engine (a cold prefix
cache, as the command starts with). The command's own engine time is read from its summary
line (`throng: 64 requests in X s`), so model loading is left out of both.

    target/py/bin/python benches/python/overhead.py [--rounds 5] [--agents 64]
"""

import argparse
import json
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time

import throng

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCHEMA = {
    "type": "object",
    "properties": {
        "price": {"type": "integer", "minimum": 0, "maximum": 100},
        "invest": {"type": "boolean"},
    },
    "required": ["price", "invest"],
    "additionalProperties": False,
}
SYSTEM = (
    "You run an energy company in a market of many. Every round you set the price of your "
    "electricity and decide whether to invest in new capacity. Answer with JSON only."
)


def messages(i):
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"You are company {i}. Last round your price was {20 + i % 50} "
         f"and you sold {100 + 7 * i % 90} units. Set this round's price."},
    ]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--agents", type=int, default=64)
    args = p.parse_args()
    requests = [
        {"messages": messages(i), "json_schema": SCHEMA, "seed": i, "temperature": 0.7,
         "max_tokens": 48}
        for i in range(args.agents)
    ]
    path = pathlib.Path(tempfile.mkdtemp()) / "requests.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in requests))
    binary = ROOT / "target" / "release" / "throng"
    py, cli = [], []
    def through_python():
        engine = throng.Engine("smollm2-135m-instruct")
        t = time.perf_counter()
        out = engine.decide([q["messages"] for q in requests], SCHEMA, temperature=0.7,
                            seed=list(range(args.agents)), max_tokens=48)
        py.append(time.perf_counter() - t)
        return out

    def through_the_command():
        done = subprocess.run([str(binary), "generate", "--requests", str(path)],
                              capture_output=True, text=True, check=True)
        m = re.search(r"throng: (\d+) requests in ([0-9.]+)s", done.stderr)
        cli.append(float(m.group(2)))
        return done

    for r in range(args.rounds):
        # Each goes first in every other round, so that neither always follows the other.
        if r % 2 == 0:
            out, done = through_python(), through_the_command()
        else:
            done, out = through_the_command(), through_python()
        lines = [json.loads(l) for l in done.stdout.splitlines()]
        same = all(a["text"] == b["text"] for a, b in zip(out, lines))
        print(f"round {r + 1}: decide {py[-1]:.3f} s, generate {cli[-1]:.3f} s, same replies: {same}",
              file=sys.stderr)
    ratios = [a / b for a, b in zip(py, cli)]
    print(json.dumps({
        "requests": args.agents,
        "decide_median_s": round(statistics.median(py), 3),
        "generate_median_s": round(statistics.median(cli), 3),
        "decide_over_generate_median_ratio": round(statistics.median(ratios), 3),
    }))


if __name__ == "__main__":
    main()
