"""The Mesa example: a Mesa model whose LLM agents decide through throng, batched once a step
or one call per agent, for 3 steps."""

import json
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
