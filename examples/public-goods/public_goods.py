"""The public-goods game of ``src/lib.rs``, written in Python: the same study, registered as a
Python scenario, run by throng's runner over the same configs and templates.

Every round each citizen splits an endowment between a private account, the pot of its
*local* group (a team) and the pot of its *global* group (the village its team belongs to).
Each pot is multiplied by its level's factor and shared equally among the level's members.
The scripted baseline is Fischbacher, Gächter and Fehr (2001): conditional cooperators, free
riders and hump-shaped contributors. See ``src/lib.rs`` for the references.

It draws the same random numbers in the same order as the Rust version and computes with the
same floating-point operations, so its scripted records equal the Rust version's byte for
byte (``python/tests/test_scenario.py`` holds it to that).

Run it (after ``pip install ./python``)::

    python examples/public-goods/public_goods.py examples/public-goods/experiments/nested.toml
"""

import math
import sys

import throng

KNOBS = {
    "endowment": 20,
    "local": "team",
    "global": "village",
    "local_factor": 1.6,
    "global_factor": 4.0,
    "free_riders": 0.3,
    "hump_shaped": 0.14,
}

KINDS = ("conditional", "free_rider", "hump_shaped")


def rust_round(x):
    """Rounds half away from zero, as Rust's ``f64::round`` (Python's ``round`` rounds half to
    even)."""
    r = math.floor(x)
    d = x - r
    if d > 0.5 or (d == 0.5 and x > 0):
        r += 1
    return float(r)


@throng.scenario
class PublicGoods(throng.Scenario):
    name = "public_goods"
    roles = ["citizen"]
    knobs = KNOBS
    columns = {
        "kind": "str",
        "local": "float64",
        "global": "float64",
        "private": "float64",
        "payoff": "float64",
        "earnings": "float64",
    }

    def __init__(self, knobs):
        # `knobs` holds every knob of KNOBS (throng refuses others, and fills in the defaults).
        k = dict(knobs)
        for field in ("local_factor", "global_factor", "free_riders", "hump_shaped"):
            k[field] = float(k[field])
        if not 1 <= k["endowment"] <= 1000:
            raise throng.ScenarioProblem("endowment", f"{k['endowment']}: give 1 to 1000 tokens")
        for field in ("local_factor", "global_factor"):
            f = k[field]
            if not (math.isfinite(f) and 0.0 < f <= 1000.0):
                raise throng.ScenarioProblem(
                    field, f"{f}: a pot's factor is a number above 0 (at most 1000)"
                )
        for field in ("free_riders", "hump_shaped"):
            if not 0.0 <= k[field] <= 1.0:
                raise throng.ScenarioProblem(field, f"{k[field]}: a share is within 0 to 1")
        if k["free_riders"] + k["hump_shaped"] > 1.0:
            raise throng.ScenarioProblem(
                "hump_shaped",
                f"free_riders + hump_shaped = {k['free_riders'] + k['hump_shaped']}: the two "
                "shares leave no room for conditional cooperators; keep their sum at most 1",
            )
        self.knobs = k
        e = k["endowment"]
        self.schema = {
            "type": "object",
            "properties": {
                "local": {"type": "integer", "minimum": 0, "maximum": e},
                "global": {"type": "integer", "minimum": 0, "maximum": e},
            },
            "required": ["local", "global"],
            "additionalProperties": False,
        }

    def check_population(self, spec):
        levels = spec["levels"]
        for field in ("local", "global"):
            if self.knobs[field] not in levels:
                raise throng.ScenarioProblem(
                    field,
                    f"`{self.knobs[field]}` is not a group level: describe the levels under "
                    f"[[population.groups]] (levels here: {', '.join(levels) or 'none'})",
                )
        if levels.index(self.knobs["global"]) <= levels.index(self.knobs["local"]):
            raise throng.ScenarioProblem(
                "global",
                f"`{self.knobs['global']}` must enclose `{self.knobs['local']}`: list the local "
                "level first under [[population.groups]] (innermost first)",
            )

    def init(self, population, rng):
        n = population.size
        kinds = []
        for _ in range(n):
            u = rng.random()
            if u < self.knobs["free_riders"]:
                kinds.append("free_rider")
            elif u < self.knobs["free_riders"] + self.knobs["hump_shaped"]:
                kinds.append("hump_shaped")
            else:
                kinds.append("conditional")
        return {
            "round": 0,
            "kind": kinds,
            "local": [0] * n,
            "global": [0] * n,
            "payoff": [0.0] * n,
            "earnings": [0.0] * n,
            # Per group level (innermost first): last round's pots and shares, per group.
            "levels": [{"total": [], "share": []} for _ in population.levels],
        }

    def num_agents(self, world):
        return len(world["kind"])

    def shared_context(self, world, step):
        k = self.knobs
        return {
            "round": step + 1,
            "rounds_played": world["round"],
            "endowment": k["endowment"],
            "local": k["local"],
            "global": k["global"],
            "local_factor": k["local_factor"],
            "global_factor": k["global_factor"],
        }

    def turn(self, world, population, agent, step):
        groups = []
        for level, g in reversed(population.path(agent)):
            pots = world["levels"][level]
            size = population.group_size(level, g)
            total = pots["total"][g] if g < len(pots["total"]) else None
            groups.append(
                {
                    "level": population.levels[level],
                    "label": population.group_label(level, g),
                    "members": size,
                    "pot": total,
                    "average": None if total is None else total / float(size),
                    "share": pots["share"][g] if g < len(pots["share"]) else None,
                }
            )
        e = self.knobs["endowment"]
        context = {
            "round": step + 1,
            "groups": groups,
            "played": world["round"] > 0,
            "local": world["local"][agent],
            "global": world["global"][agent],
            "kept": e - world["local"][agent] - world["global"][agent],
            "payoff": world["payoff"][agent],
            "earnings": world["earnings"][agent],
            "profile": [f"{name}: {value}" for name, value in population.profile(agent)],
        }
        return context, self.schema

    def parse(self, world, agent, value):
        local, glob = int(value["local"]), int(value["global"])
        e = self.knobs["endowment"]
        clamps = []
        if local > e:
            clamps.append(f"local {local} -> {e} (the endowment)")
            local = e
        if local + glob > e:
            fitted = e - local
            clamps.append(f"global {glob} -> {fitted} (local + global at most the endowment {e})")
            glob = fitted
        return {"local": local, "global": glob}, clamps

    def no_change(self, world, agent):
        return {"local": 0, "global": 0}

    def _levels(self, population):
        levels = population.levels
        return levels.index(self.knobs["local"]), levels.index(self.knobs["global"])

    def scripted(self, world, population, agent, rng):
        e = float(self.knobs["endowment"])
        local, glob = self._levels(population)
        first = world["round"] == 0

        def others(level, given):
            pots = world["levels"][level]
            g = population.group_of(level, agent)
            n = float(population.group_size(level, g))
            if n > 1.0 and pots["total"]:
                return (pots["total"][g] - float(given[agent])) / (n - 1.0)
            return None

        def opening(level, factor):
            g = population.group_of(level, agent)
            mpcr = factor / float(population.group_size(level, g))
            return e * (0.4 + 0.4 * min(mpcr, 1.0)) / 2.0

        openings = [
            opening(local, self.knobs["local_factor"]),
            opening(glob, self.knobs["global_factor"]),
        ]

        def answer(pot, other):
            o = openings[pot] if first or other is None else other
            kind = world["kind"][agent]
            if kind == "free_rider":
                return 0.0
            if kind == "conditional":
                return 0.9 * o + rng.uniform(-1.0, 1.0)
            peak = e / 4.0
            return (o if o <= peak else max(2.0 * peak - o, 0.0)) + rng.uniform(-1.0, 1.0)

        l = int(min(max(rust_round(answer(0, others(local, world["local"]))), 0.0), e))
        g = int(min(max(rust_round(answer(1, others(glob, world["global"]))), 0.0), e - l))
        return {"local": l, "global": g}

    def resolve(self, world, population, decisions, rng):
        e = self.knobs["endowment"]
        for a, d in enumerate(decisions):
            d = d or {"local": 0, "global": 0}
            world["local"][a] = d["local"]
            world["global"][a] = d["global"]
            world["payoff"][a] = float(e - d["local"] - d["global"])
        world["round"] += 1
        for pots in world["levels"]:
            pots["total"].clear()
            pots["share"].clear()

    def react(self, world, population, group):
        local, glob = self._levels(population)
        level = group["level"]
        if level == local:
            given, factor = world["local"], self.knobs["local_factor"]
        elif level == glob:
            given, factor = world["global"], self.knobs["global_factor"]
        else:
            return
        total = 0.0
        for a in group["members"]:
            total += float(given[a])
        share = total * factor / float(population.group_size(level, group["index"]))
        for a in group["members"]:
            world["payoff"][a] += share
        pots = world["levels"][level]
        groups = population.num_groups(level)
        if len(pots["total"]) < groups:
            pots["total"] += [0.0] * (groups - len(pots["total"]))
            pots["share"] += [0.0] * (groups - len(pots["share"]))
        pots["total"][group["index"]] = total
        pots["share"][group["index"]] = share
        # The outermost pot level settles last: the round's earnings are then complete.
        if level == glob and group["index"] + 1 == groups:
            for a, payoff in enumerate(world["payoff"]):
                world["earnings"][a] += payoff

    def row(self, world, agent, step):
        if step == 0:
            return None
        e = self.knobs["endowment"]
        return {
            "kind": world["kind"][agent],
            "local": float(world["local"][agent]),
            "global": float(world["global"][agent]),
            "private": float(e - world["local"][agent] - world["global"][agent]),
            "payoff": world["payoff"][agent],
            "earnings": world["earnings"][agent],
        }

    def describe(self, world):
        return {"knobs": self.knobs}


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(f"usage: python {sys.argv[0]} CONFIG [--out DIR]")
    out = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else None
    print(throng.run(sys.argv[1], out=out).folder)
