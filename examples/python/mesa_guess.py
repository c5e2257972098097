"""Guess 2/3 of the average: a Mesa model whose agents are LLMs.

Every step, each of N agents picks a whole number from 0 to 100; the winners are the agents
closest to 2/3 of the average. Each agent is asked in a short chat (the rules, its own last
guess, last round's average and target) and must reply with JSON ``{"guess": <0..100>}``,
constrained by a JSON schema. The model records the average and the target each step, and each
agent's guess, with a ``mesa.DataCollector``.

The model decides in one of three modes (``--mode``):

``batched`` (the throng way)
    The model's ``step`` gathers every agent's prompt and makes ONE call,
    ``engine.decide(prompts, schema, seed=[...])``; throng batches the N requests together.
``per-agent``
    Each agent, in its own ``step``, calls ``engine.decide([its_prompt], ...)`` itself: N calls
    a step, one request each, the way mesa-llm agents call their model.
``llama-cpp``
    Each agent calls llama-cpp-python itself (one ``create_chat_completion`` a step, with the
    schema as ``response_format``); one ``llama_cpp.Llama`` is loaded per model.
``study``
    throng's runner decides (``mesa_guess_study.py``): the same model as a throng study, with a
    run folder, replicates, records, resume and a report.

In every mode, a reply without a valid guess (not JSON, or a number outside 0..100) counts as
a failed parse and the agent keeps its previous guess. (llama-cpp-python's schema-to-grammar
conversion drops ``minimum``/``maximum``, so its replies can be out of range.)

Each agent's sampling seed is a deterministic function of (model seed, agent id, step), so a
run is reproducible in every mode.

Run (from the repository root)::

    python examples/python/mesa_guess.py --mode batched   --agents 64 --steps 3
    python examples/python/mesa_guess.py --mode per-agent --agents 64 --steps 3
    python examples/python/mesa_guess.py --mode llama-cpp --agents 64 --steps 3 [--gguf PATH]

The last line printed is one JSON object: mode, agents, steps, wall seconds (steps only, not
model loading), steps/s, decisions/s, failed parses and the final average.

Needs ``mesa`` (3.x), and ``throng`` for the first two modes or ``llama-cpp-python`` for the
third. By default llama-cpp loads the same SmolLM2-135M-Instruct GGUF that throng uses, from
throng's cache (``$THRONG_CACHE``, default ``~/.cache/throng``; ``scripts/fetch-models`` puts
it there).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import mesa

MODES = ("batched", "per-agent", "llama-cpp")

# The reply every agent must give.
SCHEMA = {
    "type": "object",
    "properties": {"guess": {"type": "integer", "minimum": 0, "maximum": 100}},
    "required": ["guess"],
    "additionalProperties": False,
}

# The rules, the same for every player: the study's `system.jinja`, read here for the modes
# that write their chats themselves.
SYSTEM_PROMPT = (
    Path(__file__).resolve().parent / "templates" / "mesa_guess" / "system.jinja"
).read_text(encoding="utf-8").strip()

MASK64 = (1 << 64) - 1


def agent_seed(model_seed: int, agent_id: int, step: int) -> int:
    """A sampling seed that depends only on (model seed, agent id, step): splitmix64 mixing,
    kept below 2**31 so that every backend accepts it."""
    x = (model_seed * 0x9E3779B97F4A7C15 + agent_id * 0xBF58476D1CE4E5B9 + step) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return (x ^ (x >> 31)) & 0x7FFFFFFF


def default_gguf() -> str:
    cache = os.environ.get("THRONG_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "throng")
    return os.path.join(cache, "assets", "smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf")


class GuessAgent(mesa.Agent):
    """A player. ``guess`` is its latest guess (None before its first valid one)."""

    def __init__(self, model: "GuessModel") -> None:
        super().__init__(model)
        self.guess: Optional[int] = None
        self.wins = 0

    def prompt(self) -> Dict[str, Any]:
        """What this step's question says: the round, the players, and last round's numbers
        (None before the first); the variables of ``templates/mesa_guess/player.jinja``."""
        m = self.model
        last = m.average is not None
        return {
            "round": m.steps,
            "players": len(m.agents),
            "mine": ("no number" if self.guess is None else str(self.guess)) if last else None,
            "average": f"{m.average:.1f}" if last else None,
            "target": f"{m.target:.1f}" if last else None,
        }

    def messages(self) -> List[Dict[str, str]]:
        """This step's chat: the rules, then what happened last round."""
        p = self.prompt()
        text = f"Round {p['round']} of the game, with {p['players']} players."
        if p["average"] is not None:
            text += (
                f" Last round you picked {p['mine']}; the average was {p['average']},"
                f" so the target (2/3 of it) was {p['target']}."
            )
        text += " What is your number?"
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": text}]

    def scripted(self, rng: Any) -> Dict[str, int]:
        """A rule for the scripted policy: 2/3 of last round's average (50 before the first),
        give or take 5."""
        base = 2 / 3 * (self.model.average if self.model.average is not None else 50.0)
        return {"guess": int(min(100, max(0, round(base + rng.uniform(-5.0, 5.0)))))}

    def seed(self) -> int:
        return agent_seed(self.model.model_seed, self.unique_id, self.model.steps)

    def receive(self, value: Any) -> None:
        """Takes a parsed reply; keeps the previous guess if it holds no valid one (no JSON,
        no integer "guess", or one outside 0..100), and counts that as a failed parse."""
        guess = value.get("guess") if isinstance(value, dict) else None
        if isinstance(guess, int) and not isinstance(guess, bool):
            if 0 <= guess <= 100:
                self.guess = guess
                return
            self.model.out_of_range += 1
        self.model.failed_parses += 1

    def step(self) -> None:
        """Per-agent modes: this agent asks its model by itself."""
        m = self.model
        if m.mode == "per-agent":
            # A reply cut off at max_tokens is a failed parse here, as it is for llama-cpp.
            result = m.engine.decide(
                [self.messages()], SCHEMA, temperature=m.temperature,
                seed=[self.seed()], max_tokens=m.max_tokens, on_length="none",
            )[0]
            m.generated_tokens += result["generated_tokens"]
            self.receive(result["value"])
        elif m.mode == "llama-cpp":
            reply = m.llm.create_chat_completion(
                messages=self.messages(),
                response_format={"type": "json_object", "schema": SCHEMA},
                temperature=m.temperature, seed=self.seed(), max_tokens=m.max_tokens,
            )
            m.generated_tokens += reply.get("usage", {}).get("completion_tokens", 0)
            try:
                value = json.loads(reply["choices"][0]["message"]["content"] or "")
            except (ValueError, KeyError, IndexError, TypeError):
                value = None
            self.receive(value)


class GuessModel(mesa.Model):
    """N LLM players of "guess 2/3 of the average".

    ``engine`` (a ``throng.Engine``, or anything with its ``decide``) serves the ``batched``
    and ``per-agent`` modes; ``llm`` (a ``llama_cpp.Llama``, or anything with its
    ``create_chat_completion``) serves ``llama-cpp``.
    """

    # Every player's reply: what a throng study (``mesa_guess_study.py``) holds decisions to.
    schema = SCHEMA

    def __init__(
        self,
        n_agents: int = 64,
        mode: str = "batched",
        engine: Any = None,
        llm: Any = None,
        temperature: float = 0.7,
        max_tokens: int = 32,
        seed: int = 0,
    ) -> None:
        super().__init__(seed=seed)
        if mode not in MODES + ("study",):
            raise ValueError(f"mode must be one of {MODES + ('study',)}, not {mode!r}")
        if mode == "llama-cpp" and llm is None:
            raise ValueError("mode 'llama-cpp' needs llm=")
        if mode in ("batched", "per-agent") and engine is None:
            raise ValueError(f"mode {mode!r} needs engine=")
        self.mode, self.engine, self.llm = mode, engine, llm
        self.model_seed = seed
        self.temperature, self.max_tokens = temperature, max_tokens
        self.average: Optional[float] = None
        self.target: Optional[float] = None
        self.winners: List[int] = []
        self.failed_parses = 0  # replies with no valid guess, out_of_range ones included
        self.out_of_range = 0
        self.generated_tokens = 0
        GuessAgent.create_agents(self, n_agents)
        self.datacollector = mesa.DataCollector(
            # Attribute names, not lambdas, so that the model pickles (a throng run's
            # checkpoints hold it); `score` makes a new `winners` list every step.
            model_reporters={"average": "average", "target": "target", "winners": "winners"},
            agent_reporters={"guess": "guess"},
        )

    def step(self) -> None:
        players = sorted(self.agents, key=lambda a: a.unique_id)
        if self.mode == "batched":
            results = self.engine.decide(
                [a.messages() for a in players], SCHEMA, temperature=self.temperature,
                seed=[a.seed() for a in players], max_tokens=self.max_tokens, on_length="none",
            )
            for agent, result in zip(players, results):
                self.generated_tokens += result["generated_tokens"]
                agent.receive(result["value"])
        elif self.mode != "study":
            self.agents.do("step")
        # In a throng study (`mesa_guess_study.py`) throng's runner has decided already: every
        # agent has received its decision, and the step goes on from there.
        self.score(players)
        self.datacollector.collect(self)

    def score(self, players: List[GuessAgent]) -> None:
        """Average and target of this round's guesses; the winners are the closest."""
        guesses = [a.guess for a in players if a.guess is not None]
        if not guesses:
            self.winners = []
            return
        self.average = sum(guesses) / len(guesses)
        self.target = 2 / 3 * self.average
        best = min(abs(g - self.target) for g in guesses)
        self.winners = [a.unique_id for a in players
                        if a.guess is not None and abs(a.guess - self.target) == best]
        for agent in players:
            if agent.unique_id in self.winners:
                agent.wins += 1


def main(argv: Optional[List[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=MODES, default="batched")
    p.add_argument("--agents", type=int, default=64)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--model", default="smollm2-135m-instruct", help="throng model (batched, per-agent)")
    p.add_argument("--device", default="cpu", help="throng device (batched, per-agent)")
    p.add_argument("--gguf", default=None, help="GGUF file for llama-cpp (default: throng's SmolLM2)")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="llama-cpp threads")
    p.add_argument("--n-ctx", type=int, default=512, help="llama-cpp context size")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    t0 = time.perf_counter()
    engine = llm = None
    if args.mode == "llama-cpp":
        import llama_cpp

        llm = llama_cpp.Llama(
            model_path=args.gguf or default_gguf(), n_ctx=args.n_ctx, seed=args.seed,
            n_threads=args.threads, n_threads_batch=args.threads, verbose=False,
        )
        model_name = os.path.basename(args.gguf or default_gguf())
    else:
        import throng

        engine = throng.Engine(model=args.model, device=args.device, weights="auto")
        model_name = args.model
    load_s = time.perf_counter() - t0

    model = GuessModel(args.agents, args.mode, engine=engine, llm=llm,
                       temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        model.step()
        print(f"step {model.steps}: average {model.average}, target {model.target}, "
              f"winners {model.winners[:8]}", flush=True)
    wall = time.perf_counter() - t0

    print(model.datacollector.get_model_vars_dataframe().to_string())
    decisions = args.agents * args.steps
    print(json.dumps({
        "mode": args.mode,
        "model": model_name,
        "agents": args.agents,
        "steps": args.steps,
        "load_s": round(load_s, 3),
        "wall_s": round(wall, 3),
        "steps_per_s": round(args.steps / wall, 4),
        "decisions_per_s": round(decisions / wall, 2),
        "generated_tokens": model.generated_tokens,
        "failed_parses": model.failed_parses,
        "out_of_range": model.out_of_range,
        "final_average": model.average,
    }))


if __name__ == "__main__":
    main()
