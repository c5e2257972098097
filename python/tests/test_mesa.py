"""The Mesa example: a Mesa model whose LLM agents decide through throng, batched once a step
or one call per agent, for 3 steps; and the same model run as a throng study."""

import json
import subprocess
import sys

import pytest

mesa = pytest.importorskip("mesa", reason="Mesa is installed by the test command (scripts/test)")


@pytest.fixture(scope="module")
def mesa_guess(root):
    sys.path.insert(0, str(root / "examples" / "python"))
    import mesa_guess

    return mesa_guess


def guesses(model):
    return {a.unique_id: a.guess for a in model.agents}


def test_the_example_runs_three_steps_from_its_command_line(mesa_guess, smollm2, capsys):
    mesa_guess.main(["--mode", "batched", "--agents", "12", "--steps", "3"])
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["mode"] == "batched" and summary["steps"] == 3 and summary["agents"] == 12
    assert summary["failed_parses"] == 0
    assert 0 <= summary["final_average"] <= 100


def test_batched_and_one_call_per_agent_decide_alike(mesa_guess, smollm2):
    batched = mesa_guess.GuessModel(10, "batched", engine=smollm2, seed=3)
    per_agent = mesa_guess.GuessModel(10, "per-agent", engine=smollm2, seed=3)
    for _ in range(3):
        batched.step()
        per_agent.step()
        # The engine is batch invariant and each agent's seed is its own: a step decided as
        # one batch gives each agent what its own call gives it.
        assert guesses(batched) == guesses(per_agent)
    assert batched.failed_parses == 0
    assert all(0 <= g <= 100 for g in guesses(batched).values())
    frame = batched.datacollector.get_model_vars_dataframe()
    assert len(frame) == 3 and frame["average"].notna().all()
    assert len(batched.datacollector.get_agent_vars_dataframe()) == 30


# Guards against issue 42, item 4: a Mesa model could only call `Engine.decide`, with no run
# folder, replicates, records, resume or report. Through `throng.mesa.study` the example's own
# model runs under throng's runner: the LLM arm beside the model's scripted rule.
@pytest.fixture(scope="module")
def mesa_study(root, mesa_guess):
    import mesa_guess_study

    return mesa_guess_study


def test_a_mesa_model_runs_as_a_throng_study_with_its_records_and_report(
    root, tmp_path, smollm2, mesa_study
):
    import throng

    config = root / "examples" / "python" / "mesa_guess.toml"
    run = throng.run(config, agents=12, steps=2, out=tmp_path / "run")
    assert run.status == "finished"
    state = run.state()
    # 2 arms x 3 replicates x 12 players, at steps 0 to 2; every guess from step 1 on in bounds.
    assert len(state) == 2 * 3 * 12 * 3
    assert set(state["arm"]) == {"llm", "scripted"} and set(state["replicate"]) == {0, 1, 2}
    decided = state[state["step"] >= 1]
    assert decided["guess"].notna().all() and decided["guess"].between(0, 100).all()
    decisions = run.decisions()
    assert set(decisions[decisions["arm"] == "llm"]["policy"]) == {"llm"}
    assert set(decisions[decisions["arm"] == "scripted"]["policy"]) == {"scripted"}
    # The model's own measures, every step, per cell.
    aggregates = run.aggregates()
    assert {"average", "target"} <= set(aggregates.columns)
    assert len(aggregates) == 2 * 3 * 3
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert any(t["column"] == "guess" and t["arm"] == "scripted" for t in summary["arm_tests"])
    assert (tmp_path / "run" / "report.html").exists()
    # The run folder names the module, so the command's report finds the study by itself.
    reported = subprocess.run([sys.executable, "-m", "throng", "report", str(tmp_path / "run")],
                              capture_output=True, text=True, cwd=tmp_path)
    assert reported.returncode == 0, reported.stderr


def test_a_stopped_mesa_study_resumes_to_the_records_of_one_that_was_not(
    root, tmp_path, mesa_study
):
    import throng

    config = root / "examples" / "python" / "mesa_guess.toml"
    settings = dict(agents=10, steps=3, replicates=2, policy="scripted", no_report=True)
    whole = throng.run(config, out=tmp_path / "whole", **settings)
    stopped = throng.run(config, out=tmp_path / "stopped", stop_after=1, **settings)
    assert stopped.status == "paused"
    # The checkpoint holds the Mesa model, DataCollector and all, and the run goes on from it.
    resumed = throng.run(resume=stopped.folder, no_report=True)
    assert resumed.status == "finished"
    for name in ("state.parquet", "aggregates.csv", "decisions.jsonl"):
        assert (tmp_path / "whole" / name).read_bytes() == (tmp_path / "stopped" / name).read_bytes(), name
