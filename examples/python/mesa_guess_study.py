"""The Mesa model of ``mesa_guess.py`` as a throng study: its agents decide through throng's
runner, and the run gets a run folder, replicates, records, checkpoints, exact resume and a
report. What the model needed for it: ``prompt()`` (the template's variables) beside the
chat it writes for the other modes, a ``scripted(rng)`` rule, and a ``study`` mode whose
``step`` leaves the deciding to throng.

Run (from the repository root)::

    python examples/python/mesa_guess_study.py examples/python/mesa_guess.toml --out runs/mesa-guess
    throng report runs/mesa-guess            # or python -m throng report runs/mesa-guess
"""

import sys
from pathlib import Path

import throng
import throng.mesa

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mesa_guess import GuessModel  # noqa: E402

GuessStudy = throng.mesa.study(
    GuessModel,
    name="mesa_guess",
    roles=["player"],
    build=lambda population, seed, **knobs: GuessModel(
        population.size, mode="study", seed=seed, **knobs
    ),
    # The state table: each agent's guess and wins every step, as the model's DataCollector
    # keeps them; aggregates.csv: the round's average and target.
    columns={"guess": "int64?", "wins": "int64"},
    aggregates_columns={"average": "float64?", "target": "float64?"},
)

if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(f"usage: python {sys.argv[0]} CONFIG [--out DIR]")
    out = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else None
    run = throng.run(sys.argv[1], out=out)
    print(run.folder)
