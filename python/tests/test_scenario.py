"""A scenario written in Python runs under throng's runner as a Rust one does: the public-goods
study in Python writes the Rust version's records byte for byte, resumes exactly after a kill,
survives its own exceptions, and gets a report."""

import filecmp
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import throng

STUDY = "examples/public-goods"


@pytest.fixture(scope="module")
def public_goods(root):
    sys.path.insert(0, str(root / STUDY))
    import public_goods

    return public_goods


@pytest.fixture(scope="module")
def rust_study(root):
    """The Rust version's program (the example study's own binary)."""
    path = root / "target" / "release" / "public-goods"
    if not path.exists():
        subprocess.run(
            ["cargo", "build", "--release", "-p", "public-goods"], cwd=root, check=True
        )
    return path


# What differs between two runs of the same records: when they ran and how long they took,
# and the checkpoint, which holds each version's own encoding of its world.
NOT_RECORDS = {"manifest.json", "steps.csv", "checkpoint.bin", "checkpoint.prev.bin", ".throng.lock"}


def record_files(folder):
    files = []
    for dirpath, _, names in os.walk(folder):
        for name in names:
            path = os.path.relpath(os.path.join(dirpath, name), folder)
            if name not in NOT_RECORDS:
                files.append(path)
    return sorted(files)


def assert_same_records(a, b):
    files = record_files(a)
    assert files == record_files(b)
    assert "decisions.jsonl" in files and "state.parquet" in files
    for name in files:
        assert filecmp.cmp(a / name, b / name, shallow=False), f"{name} differs"


def test_the_python_twin_writes_the_rust_versions_records_byte_for_byte(
    root, tmp_path, public_goods, rust_study
):
    config = root / STUDY / "experiments" / "nested.toml"
    rust = tmp_path / "rust"
    subprocess.run(
        [str(rust_study), "run", str(config), "--steps", "4", "--replicates", "2", "--no-report",
         "--out", str(rust)],
        check=True,
        capture_output=True,
    )
    python = tmp_path / "python"
    run = throng.run(config, steps=4, replicates=2, no_report=True, out=python)
    assert run.status == "finished"
    assert_same_records(rust, python)
    assert run.state()["kind"].nunique() == 3


def test_under_the_model_its_prompts_and_decisions_equal_the_rust_versions(
    root, tmp_path, public_goods, rust_study, smollm2
):
    config = root / STUDY / "experiments" / "nested.toml"
    common = ["--policy", "llm", "--agents", "10", "--steps", "2", "--replicates", "1",
              "--no-report"]
    rust = tmp_path / "rust"
    subprocess.run(
        [str(rust_study), "run", str(config), *common, "--out", str(rust)],
        check=True,
        capture_output=True,
    )
    python = tmp_path / "python"
    throng.run(config, policy="llm", agents=[10], steps=2, replicates=1, no_report=True, out=python)
    strip = lambda line: {k: v for k, v in json.loads(line).items() if k != "latency_ms"}
    ours = [strip(l) for l in (python / "decisions.jsonl").read_text().splitlines()]
    theirs = [strip(l) for l in (rust / "decisions.jsonl").read_text().splitlines()]
    assert len(ours) == 40 and ours == theirs
    assert any(d["text"] for d in ours)
    assert (python / "prompts.jsonl").read_bytes() == (rust / "prompts.jsonl").read_bytes()
    assert filecmp.cmp(python / "state.parquet", rust / "state.parquet", shallow=False)


KILLED = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {study!r})
    import public_goods, throng
    throng.run({config!r}, steps=40, replicates=3, no_report=True, out={out!r})
    """
)


def test_a_killed_run_resumes_to_the_records_of_one_that_was_not(root, tmp_path, public_goods):
    config = str(root / STUDY / "experiments" / "nested.toml")
    whole = tmp_path / "whole"
    throng.run(config, steps=40, replicates=3, no_report=True, out=whole)
    killed = tmp_path / "killed"
    script = KILLED.format(study=str(root / STUDY), config=config, out=str(killed))
    child = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.DEVNULL)
    # Killed once a few steps are down, wherever in a step it is.
    wait_for_steps(child, killed / "steps.csv", 5)
    child.send_signal(signal.SIGKILL)
    child.wait()
    manifest = json.loads((killed / "manifest.json").read_text())
    assert 0 < manifest["steps_done"] < 40
    run = throng.run(resume=killed, no_report=True)
    assert run.status == "finished"
    assert_same_records(whole, killed)


INTERRUPTED = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {study!r})
    import public_goods, throng
    try:
        throng.run({config!r}, steps=40, replicates=3, no_report=True, out={out!r})
    except KeyboardInterrupt as e:
        print("interrupted")
        print(e.folder)
        print(e)
    """
)


def wait_for_steps(child, steps_csv, n):
    deadline = time.time() + 300
    while time.time() < deadline and child.poll() is None:
        if steps_csv.exists() and len(steps_csv.read_text().splitlines()) > n:
            return
        time.sleep(0.05)
    assert child.poll() is None, "the run ended before the signal"


def test_ctrl_c_raises_keyboard_interrupt_naming_the_folder_and_the_run_resumes_exactly(
    root, tmp_path, public_goods
):
    config = str(root / STUDY / "experiments" / "nested.toml")
    whole = tmp_path / "whole"
    throng.run(config, steps=40, replicates=3, no_report=True, out=whole)
    stopped = tmp_path / "stopped"
    script = INTERRUPTED.format(study=str(root / STUDY), config=config, out=str(stopped))
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    wait_for_steps(child, stopped / "steps.csv", 5)
    child.send_signal(signal.SIGINT)
    out, _ = child.communicate(timeout=120)
    assert child.returncode == 0 and "interrupted" in out
    # The exception says where the run is, and how to resume it.
    lines = out.splitlines()
    folder, message = lines[lines.index("interrupted") + 1 :][:2]
    assert folder == str(stopped)
    assert f"throng.run(resume={str(stopped)!r})" in message and "paused" in message
    assert json.loads((stopped / "manifest.json").read_text())["steps_done"] < 40
    throng.run(resume=stopped, no_report=True)
    assert_same_records(whole, stopped)


def test_a_world_pickle_cannot_write_is_refused_at_init(root, tmp_path, public_goods):
    class Unpicklable(public_goods.PublicGoods):
        def init(self, population, rng):
            world = super().init(population, rng)
            world["callback"] = lambda: None
            return world

    with pytest.raises(throng.RunError, match="`init` raised TypeError") as e:
        throng.run(
            root / STUDY / "experiments" / "nested.toml",
            steps=1,
            no_report=True,
            out=tmp_path / "u",
            scenarios=[Unpicklable],
        )
    assert "cannot be pickled" in str(e.value.__cause__)


def test_an_exception_in_the_scenario_stops_the_run_and_a_resume_finishes_it(
    root, tmp_path, public_goods
):
    config = root / STUDY / "experiments" / "nested.toml"
    whole = tmp_path / "whole"
    throng.run(config, steps=5, replicates=1, no_report=True, out=whole)

    class Faulty(public_goods.PublicGoods):
        fail = True

        def resolve(self, world, population, decisions, rng):
            if Faulty.fail and world["round"] == 3:
                raise ZeroDivisionError("a bug in round 4")
            return super().resolve(world, population, decisions, rng)

    out = tmp_path / "faulty"
    with pytest.raises(throng.RunError) as e:
        throng.run(config, steps=5, replicates=1, no_report=True, out=out, scenarios=[Faulty])
    assert "`resolve` raised ZeroDivisionError" in str(e.value)
    assert isinstance(e.value.__cause__, ZeroDivisionError)
    assert json.loads((out / "manifest.json").read_text())["steps_done"] == 3
    Faulty.fail = False
    run = throng.run(resume=out, scenarios=[Faulty], no_report=True)
    assert run.status == "finished"
    assert_same_records(whole, out)


def test_a_python_scenario_gets_the_generic_report(root, tmp_path, public_goods):
    run = throng.run(
        root / STUDY / "experiments" / "nested.toml", steps=3, replicates=2, out=tmp_path / "r"
    )
    assert "payoff" in run.report()
    assert os.path.exists(run.report_path)


def test_a_knob_the_class_refuses_is_named_at_its_line(root, tmp_path, public_goods):
    text = (root / STUDY / "experiments" / "nested.toml").read_text()
    bad = tmp_path / "bad.toml"
    bad.write_text(
        text.replace("endowment = 20", "endowment = 0").replace(
            '"../templates/public_goods"', repr(str(root / STUDY / "templates" / "public_goods"))
        )
    )
    with pytest.raises(throng.ConfigError) as e:
        throng.run(bad, out=tmp_path / "never")
    message = str(e.value)
    line = text.splitlines().index("endowment = 20") + 1
    assert f"bad.toml:{line}" in message and "field `endowment`" in message and "1 to 1000" in message


def test_a_class_without_the_protocol_is_refused(root):
    class NoTurn:
        name = "half_done"
        roles = ["citizen"]

        def init(self, population, rng):
            return {}

    with pytest.raises(TypeError, match="no `num_agents` method"):
        throng.run(root / STUDY / "experiments" / "nested.toml", scenarios=[NoTurn])


def test_a_population_kept_past_its_call_is_gone(root, tmp_path, public_goods):
    class Keeper(public_goods.PublicGoods):
        def init(self, population, rng):
            world = super().init(population, rng)
            Keeper.kept = population
            return world

    throng.run(
        root / STUDY / "experiments" / "nested.toml",
        steps=1,
        replicates=1,
        no_report=True,
        out=tmp_path / "k",
        scenarios=[Keeper],
    )
    with pytest.raises(RuntimeError, match="lent to one call"):
        Keeper.kept.size


def test_aggregates_and_tables_of_its_own_reach_the_run_folder(root, tmp_path, public_goods):
    class Reported(public_goods.PublicGoods):
        aggregates_columns = {"mean_local": "float64", "free_riders": "uint32"}
        tables = {"pots": {"level": "str", "group": "uint32", "total": "float64"}}

        def aggregates(self, world, cell, step):
            n = len(world["local"])
            return {
                "mean_local": sum(world["local"]) / n,
                "free_riders": world["kind"].count("free_rider"),
            }

        def table(self, name, world, cell, step):
            assert name == "pots"
            return [
                {"level": level, "group": g, "total": total}
                for level, pots in zip(("team", "village", "area"), world["levels"])
                for g, total in enumerate(pots["total"])
            ]

    run = throng.run(
        root / STUDY / "experiments" / "nested.toml",
        steps=3,
        replicates=2,
        out=tmp_path / "reported",
        scenarios=[Reported],
    )
    aggregates = run.aggregates()
    assert list(aggregates.columns) == [
        "arm", "population", "replicate", "step", "mean_local", "free_riders"
    ]
    # Steps 0 (before anyone moves, as in the state table) to 3, per arm and replicate.
    assert len(aggregates) == 2 * 2 * 4
    assert set(aggregates.step) == {0, 1, 2, 3}
    # The report carries them: each column's mean per step over the replicates, by arm.
    summary = json.loads((tmp_path / "reported" / "summary.json").read_text())
    means = [m for m in summary["aggregates"] if m["column"] == "mean_local" and m["step"] == 3]
    assert len(means) == 2 and all(m["replicates"] == 2 for m in means)
    for m in means:
        cells = aggregates[(aggregates.arm == m["arm"]) & (aggregates.step == 3)]
        assert m["mean"] == pytest.approx(cells.mean_local.mean())
        assert m["ci_low"] <= m["mean"] <= m["ci_high"]
    page = (tmp_path / "reported" / "report.html").read_text()
    assert "The study's own measures" in page and "aggregate_mean_local" in page
    state = run.state()
    for _, row in aggregates.iterrows():
        if row.step == 0:
            # Before anyone moves: nothing given yet (the study keeps no state row then).
            assert row.mean_local == 0
            continue
        mine = state[
            (state.arm == row.arm) & (state.replicate == row.replicate) & (state.step == row.step)
        ]
        assert row.mean_local == pytest.approx(mine.local.mean())
        assert row.free_riders == (mine.kind == "free_rider").sum()
    pots = run.table("pots")
    assert set(pots.level) == {"team", "village"} and set(pots.step) == {1, 2, 3}
    assert "pots" in run.tables()
    # A team's pot is what its members put in.
    teams = pots[(pots.level == "team") & (pots.step == 1)]
    assert teams.total.sum() == pytest.approx(
        state[state.step == 1].groupby(["arm", "replicate"]).local.sum().sum()
    )


def test_a_run_stopped_by_the_scenarios_exception_is_marked_failed_with_its_traceback(
    root, tmp_path, public_goods
):
    class Broken(public_goods.PublicGoods):
        def resolve(self, world, population, decisions, rng):
            if world["round"] == 1:
                raise KeyError("no such pot")
            return super().resolve(world, population, decisions, rng)

    out = tmp_path / "broken"
    with pytest.raises(throng.RunError) as e:
        throng.run(
            root / STUDY / "experiments" / "nested.toml",
            steps=3,
            replicates=1,
            no_report=True,
            out=out,
            scenarios=[Broken],
        )
    # The exception still reaches the caller, and says where the run is.
    assert isinstance(e.value.__cause__, KeyError)
    assert e.value.folder == str(out) and f"throng.run(resume={str(out)!r})" in str(e.value)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "failed" and manifest["steps_done"] == 1
    error = manifest["error"]
    assert "`resolve` raised KeyError" in error and "no such pot" in error
    # The traceback's last lines: the line that raised, in this file.
    assert 'raise KeyError("no such pot")' in error and "test_scenario.py" in error
    assert throng.open_run(out).status == "failed"


# A schema with every kind of bound a model's reply is held to.
CHOICE_SCHEMA = {
    "type": "object",
    "properties": {
        "local": {"type": "integer", "minimum": 0, "maximum": 20},
        "global": {"type": "integer", "minimum": 0, "maximum": 20},
        "mood": {"enum": ["calm", "angry"]},
    },
    "required": ["local", "global", "mood"],
    "additionalProperties": False,
}


@pytest.mark.parametrize(
    "bad, problem",
    [
        ({"local": 25, "global": 0, "mood": "calm"}, "25 is greater than the maximum of 20"),
        ({"local": "5", "global": 0, "mood": "calm"}, '"5" is not of type "integer"'),
        ({"local": 5, "global": 0, "mood": "bored"}, '"bored" is not one of'),
        ({"local": 5, "global": 0}, '"mood" is a required property'),
        ({"local": 5, "global": 0, "mood": "calm", "tip": 1}, "tip"),
    ],
)
def test_a_scripted_decision_outside_the_schema_stops_the_run_naming_agent_and_step(
    root, tmp_path, public_goods, bad, problem
):
    class Moody(public_goods.PublicGoods):
        def turn(self, world, population, agent, step):
            context, _ = super().turn(world, population, agent, step)
            return context, CHOICE_SCHEMA

        def scripted(self, world, population, agent, rng):
            decision = super().scripted(world, population, agent, rng)
            if world["round"] == 1 and agent == 3:
                return bad
            return {**decision, "mood": "calm"}

        def resolve(self, world, population, decisions, rng):
            plain = [None if d is None else {k: d[k] for k in ("local", "global")} for d in decisions]
            return super().resolve(world, population, plain, rng)

    out = tmp_path / "moody"
    with pytest.raises(throng.RunError) as e:
        throng.run(
            root / STUDY / "experiments" / "nested.toml",
            steps=3,
            replicates=1,
            agents=[20],
            no_report=True,
            out=out,
            scenarios=[Moody],
        )
    message = str(e.value)
    assert "scripted decision of agent 3 at step 2" in message, message
    assert problem in message, message
    # Refused, not recorded as given: the run keeps the step before it, and is marked failed.
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "failed" and manifest["steps_done"] == 1
    assert problem in manifest["error"]
    recorded = [json.loads(l) for l in (out / "decisions.jsonl").read_text().splitlines()]
    assert bad not in [d["decision"] for d in recorded]


def test_a_class_may_leave_its_scripted_decisions_unchecked(root, tmp_path, public_goods):
    class Reshaped(public_goods.PublicGoods):
        check_scripted = False

        def scripted(self, world, population, agent, rng):
            return {"give": super().scripted(world, population, agent, rng)}

        def resolve(self, world, population, decisions, rng):
            return super().resolve(
                world, population, [None if d is None else d["give"] for d in decisions], rng
            )

    run = throng.run(
        root / STUDY / "experiments" / "nested.toml",
        steps=2,
        replicates=1,
        agents=[20],
        no_report=True,
        out=tmp_path / "reshaped",
        scenarios=[Reshaped],
    )
    assert run.status == "finished"


def plain_class(declared):
    """A public-goods class that checks none of its knobs itself, declaring `declared`."""

    class Trusting(throng.Scenario):
        name = "public_goods"
        roles = ["citizen"]
        given = []

        def __init__(self, knobs):
            Trusting.given.append(dict(knobs))

        def init(self, population, rng):
            return {"n": population.size}

        def num_agents(self, world):
            return world["n"]

        def turn(self, world, population, agent, step):
            return {}, {"type": "object"}

        def scripted(self, world, population, agent, rng):
            return {}

        def resolve(self, world, population, decisions, rng):
            return None

    if declared is not None:
        Trusting.knobs = declared
    return Trusting


def config_with(root, tmp_path, old, new):
    text = (root / STUDY / "experiments" / "nested.toml").read_text()
    assert old in text
    bad = tmp_path / "bad.toml"
    bad.write_text(
        text.replace(old, new).replace(
            '"../templates/public_goods"', repr(str(root / STUDY / "templates" / "public_goods"))
        )
    )
    line = text.splitlines().index(old) + 1
    return bad, line


def test_a_knob_the_class_does_not_declare_is_refused_at_its_line(root, tmp_path):
    bad, line = config_with(root, tmp_path, "endowment = 20", "endowmnet = 20")
    Trusting = plain_class({"endowment": 20, "local": "team", "global": "village",
                            "local_factor": 1.6, "global_factor": 4.0})
    with pytest.raises(throng.ConfigError) as e:
        throng.run(bad, steps=1, no_report=True, out=tmp_path / "never", scenarios=[Trusting])
    message = str(e.value)
    assert f"bad.toml:{line}" in message, message
    assert "unknown field `endowmnet`, expected one of `endowment`, `local`" in message
    assert not (tmp_path / "never").exists()


def test_a_class_that_declares_no_knobs_refuses_every_knob(root, tmp_path):
    bad, line = config_with(root, tmp_path, "endowment = 20", "endowment = 20")
    Trusting = plain_class(None)
    with pytest.raises(throng.ConfigError) as e:
        throng.run(bad, steps=1, no_report=True, out=tmp_path / "never", scenarios=[Trusting])
    message = str(e.value)
    assert f"bad.toml:{line}" in message and "unknown field `endowment`" in message, message
    assert "declares no knobs" in message and "`knobs`" in message


def test_declared_knobs_reach_init_over_their_defaults(root, tmp_path):
    Trusting = plain_class({"endowment": 20, "local": "team", "global": "village",
                            "local_factor": 1.6, "global_factor": 4.0, "free_riders": [0.3]})
    throng.run(
        root / STUDY / "experiments" / "nested.toml",
        steps=1,
        replicates=1,
        agents=[20],
        no_report=True,
        out=tmp_path / "knobs",
        scenarios=[Trusting],
    )
    # The base table, then each arm's: the config's values over the class's defaults.
    assert Trusting.given[0] == {"endowment": 20, "local": "team", "global": "village",
                                 "local_factor": 1.6, "global_factor": 4.0, "free_riders": [0.3]}
    assert [g["global_factor"] for g in Trusting.given[1:3]] == [2.0, 8.0]
    # Each instance gets its own copy of a default.
    assert Trusting.given[1]["free_riders"] is not Trusting.knobs["free_riders"]


def test_check_population_sees_every_size_and_names_the_agents_line(root, tmp_path, public_goods):
    class Grid(public_goods.PublicGoods):
        seen = []

        def check_population(self, spec):
            super().check_population(spec)
            Grid.seen.append(spec["sizes"])
            if max(spec["sizes"]) > 100:
                raise throng.ScenarioProblem(
                    "agents", f"{max(spec['sizes'])} agents do not fit a grid of 100 cells"
                )

    config = root / STUDY / "experiments" / "nested.toml"
    with pytest.raises(throng.ConfigError) as e:
        throng.run(config, out=tmp_path / "never", scenarios=[Grid])
    message = str(e.value)
    line = config.read_text().splitlines().index("agents = 200") + 1
    assert f"nested.toml:{line}" in message and "200 agents do not fit" in message, message
    assert Grid.seen[0] == [200]
    assert not (tmp_path / "never").exists()


# Issue 42 item 7: `profile` gave every value as text, and an integer attribute came back as a
# float: a study compared "34" with 34, or 34.0 with 34.
def test_a_population_gives_its_attributes_typed_and_whole_numbers_as_ints(tmp_path):
    seen = {}

    @throng.scenario
    class Census(throng.Scenario):
        name = "census"
        roles = ["resident"]

        def init(self, population, rng):
            seen["attributes"] = population.attributes
            seen["profiles"] = [population.profile(a) for a in range(population.size)]
            seen["age"] = population.attribute(0, "age")
            with pytest.raises(KeyError, match="`height` is not an attribute"):
                population.attribute(0, "height")
            with pytest.raises(IndexError):
                population.profile(population.size)
            return {"n": population.size}

        def num_agents(self, world):
            return world["n"]

        def turn(self, world, population, agent, step):
            return {}, {"type": "object"}

        def scripted(self, world, population, agent, rng):
            return {}

        def resolve(self, world, population, decisions, rng):
            return None

    templates = tmp_path / "templates"
    templates.mkdir()
    (templates / "resident.jinja").write_text("Decide.\n")
    (templates / "system.jinja").write_text("You live here.\n")
    config = tmp_path / "census.toml"
    config.write_text(textwrap.dedent(f"""\
        name = "census"
        seed = 3
        steps = 1
        agents = 50
        policy = "scripted"
        templates = {str(templates)!r}

        [scenario]
        name = "census"

        [population.attributes.age]
        range = [18, 80]
        integer = true

        [population.attributes.income]
        range = [0.5, 9.5]

        [population.attributes.region]
        shares = {{ north = 50, south = 50 }}
        """))
    throng.run(config, scenarios=[Census], no_report=True, out=tmp_path / "run")
    assert seen["attributes"] == ["age", "income", "region"]
    for profile in seen["profiles"]:
        (age_name, age), (income_name, income), (region_name, region) = profile
        assert (age_name, income_name, region_name) == ("age", "income", "region")
        assert type(age) is int and 18 <= age <= 80
        assert type(income) is float and 0.5 <= income <= 9.5
        # The shortest decimal of the stored 32-bit float, not its binary expansion.
        assert len(repr(income)) <= 12, income
        assert region in ("north", "south")
    assert seen["age"] == seen["profiles"][0][0][1]


# Issue 42 item 5: `throng report DIR` and `open_run(DIR).report()` without the study's module
# imported said only that the program did not know the scenario.
def test_a_python_studys_run_is_reported_from_the_module_it_recorded(
    root, tmp_path, public_goods, throng_bin
):
    run = throng.run(
        root / STUDY / "experiments" / "nested.toml", steps=1, replicates=1, agents=40,
        no_report=True, out=tmp_path / "r",
    )
    origin = run.manifest["defined_in"]
    assert origin["language"] == "python" and origin["class"] == "PublicGoods", origin
    assert origin["file"] == str(root / STUDY / "public_goods.py"), origin
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    fresh = {"cwd": elsewhere, "capture_output": True, "text": True}
    # A fresh interpreter, where `public_goods` is not importable by name: its file is.
    opened = subprocess.run(
        [sys.executable, "-c", f"import throng; print(throng.open_run({str(run.folder)!r}).report())"],
        **fresh,
    )
    assert opened.returncode == 0, opened.stderr
    assert "payoff" in opened.stdout
    command = subprocess.run([sys.executable, "-m", "throng", "report", run.folder], **fresh)
    assert command.returncode == 0, command.stderr
    assert "report.html" in command.stdout
    # The binary cannot import Python: it names the class, its file and what to run.
    binary = subprocess.run([str(throng_bin), "report", run.folder], **fresh)
    assert binary.returncode != 0
    said = binary.stderr
    assert "PublicGoods" in said and str(root / STUDY / "public_goods.py") in said, said
    assert f"python -m throng report {run.folder}" in said, said
    paused = throng.run(
        root / STUDY / "experiments" / "nested.toml", steps=2, replicates=1, agents=40,
        stop_after=1, no_report=True, out=tmp_path / "paused",
    )
    refused = subprocess.run([str(throng_bin), "run", "--resume", paused.folder], **fresh)
    assert refused.returncode != 0
    assert f"python -m throng run --resume {paused.folder}" in refused.stderr, refused.stderr
    resumed = subprocess.run(
        [sys.executable, "-m", "throng", "run", "--resume", paused.folder, "--no-report"], **fresh
    )
    assert resumed.returncode == 0, resumed.stderr
    assert throng.open_run(paused.folder).status == "finished"


def test_the_throng_command_imports_a_study_named_with_import(root, tmp_path, public_goods):
    config = root / STUDY / "experiments" / "nested.toml"
    module = root / STUDY / "public_goods.py"
    args = ["run", str(config), "--steps", "1", "--replicates", "1", "--agents", "40",
            "--no-report", "--out", str(tmp_path / "r"), "--policy", "scripted"]
    bare = subprocess.run([sys.executable, "-m", "throng", *args], capture_output=True, text=True,
                          cwd=tmp_path)
    assert bare.returncode != 0 and "--import MODULE" in bare.stderr, bare.stderr
    given = subprocess.run([sys.executable, "-m", "throng", "--import", str(module), *args],
                           capture_output=True, text=True, cwd=tmp_path)
    assert given.returncode == 0, given.stderr
    assert (tmp_path / "r" / "state.parquet").exists()
