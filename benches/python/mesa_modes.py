"""The Mesa example's three ways of deciding, taking turns in one sitting: one batched throng
call a step, one throng call per agent, one llama-cpp-python call per agent (the way mesa-llm
users run local models), each for the same agents and steps, over the same SmolLM2 Q4_1 file.
Prints each run's steps/s, then the medians and the ratios of medians.

    python benches/python/mesa_modes.py --rounds 2 [--agents 64 --steps 3]
        [--llama-python /work/venv-bench/bin/python]

`--llama-python` is a Python with llama-cpp-python and Mesa installed (building
llama-cpp-python compiles llama.cpp: about 6 minutes on 2 cores); without it that mode is
skipped. The throng modes run in this Python.

Each run is a process of its own, so each mode starts on a fresh engine: one mode never finds
another's prompts in the prefix cache (on one engine, the order of the modes alone moved the
ratio from 1.1 to 6.4). Within a run the cache is on, as in use.
"""

import argparse
import json
import pathlib
import statistics
import subprocess
import sys

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "python" / "mesa_guess.py"


def once(python, mode, agents, steps):
    out = subprocess.run([python, str(EXAMPLE), "--mode", mode, "--agents", str(agents),
                          "--steps", str(steps)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--agents", type=int, default=64)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--llama-python", default=None)
    args = p.parse_args()
    modes = [("batched", sys.executable), ("per-agent", sys.executable)]
    if args.llama_python:
        modes.append(("llama-cpp", args.llama_python))
    rates = {m: [] for m, _ in modes}
    for r in range(args.rounds):
        for mode, python in modes:
            s = once(python, mode, args.agents, args.steps)
            rates[mode].append(s["steps_per_s"])
            print(f"round {r + 1} {mode}: {s['steps_per_s']:.4f} steps/s, "
                  f"{s['decisions_per_s']:.2f} decisions/s, failed parses {s['failed_parses']}",
                  file=sys.stderr)
    med = {m: statistics.median(v) for m, v in rates.items()}
    summary = {"agents": args.agents, "steps": args.steps, "steps_per_s": med}
    for other in med:
        if other != "batched":
            summary[f"batched_over_{other}"] = round(med["batched"] / med[other], 2)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
