"""throng.run and throng.open_run: a config run as the command line runs it, and its records
read back as the files hold them."""

import json

import pandas as pd
import pyarrow as pa
import pyarrow.csv
import pyarrow.parquet as pq
import pytest

import throng


def assert_equal_tables(ours, theirs):
    """Equal columns and values. pyarrow reads a Parquet dictionary of large strings back as
    one of strings, so the types are compared after that one widening."""
    assert ours.column_names == theirs.column_names
    assert ours.to_pydict() == theirs.to_pydict()
    for a, b in zip(ours.schema, theirs.schema):
        if pa.types.is_dictionary(a.type) and pa.types.is_dictionary(b.type):
            assert a.type.index_type == b.type.index_type
        else:
            assert a.type == b.type, (a, b)


def assert_equal_frames(ours, theirs):
    pd.testing.assert_frame_equal(ours, theirs, check_categorical=False)


def test_a_run_reads_back_as_its_files(root, tmp_path):
    out = tmp_path / "exp2"
    run = throng.run(
        root / "experiments" / "exp2-regulated.toml",
        policy="scripted",
        steps=3,
        replicates=2,
        out=out,
    )
    assert run.status == "finished"
    assert run.manifest["steps_done"] == 3

    state = run.state(as_="arrow")
    assert isinstance(state, pa.Table)
    assert_equal_tables(state, pq.read_table(out / "state.parquet"))
    assert_equal_frames(run.state(), pq.read_table(out / "state.parquet").to_pandas())
    assert set(state.column("step").to_pylist()) == {0, 1, 2, 3}
    assert_equal_tables(run.table("trades", as_="arrow"), pq.read_table(out / "trades.parquet"))

    assert run.steps(as_="arrow").equals(pyarrow.csv.read_csv(out / "steps.csv"))
    assert run.steps().equals(pd.read_csv(out / "steps.csv"))
    with pytest.raises(throng.ThrongError, match="has no aggregates.csv"):
        run.aggregates()

    lines = [json.loads(l) for l in (out / "decisions.jsonl").read_text().splitlines()]
    decisions = run.decisions()
    assert len(decisions) == len(lines)
    assert list(decisions["agent"]) == [l["agent"] for l in lines]
    first = {k: v for k, v in lines[0]["decision"].items()}
    for field, value in first.items():
        assert decisions[f"decision.{field}"].iloc[0] == value

    assert "state" in run.tables()
    summary = run.report()
    assert summary.strip() and (out / "report.html").exists()
    assert "exp2" in repr(run) or "energy_market" in repr(run)


def test_a_paused_run_reads_its_parts_and_resumes(root, tmp_path):
    out = tmp_path / "paused"
    run = throng.run(
        root / "experiments" / "exp2-regulated.toml",
        policy="scripted",
        steps=4,
        replicates=1,
        stop_after=2,
        out=out,
    )
    assert run.status == "paused"
    parts = sorted((out / "state.parts").glob("*.parquet"))
    assert parts, "a paused run keeps its state in parts"
    assert_equal_tables(run.state(as_="arrow"), pa.concat_tables([pq.read_table(p) for p in parts]))
    paused_rows = run.state(as_="arrow").num_rows
    resumed = throng.run(resume=out)
    assert resumed.status == "finished" and run.status == "finished"
    whole = resumed.state(as_="arrow")
    assert whole.num_rows > paused_rows
    assert set(whole.column("step").to_pylist()) == {0, 1, 2, 3, 4}


def test_open_run_reads_a_run_the_command_line_wrote(root, tmp_path, throng_bin):
    import subprocess

    out = tmp_path / "cli"
    subprocess.run(
        [
            str(throng_bin),
            "run",
            str(root / "experiments" / "guess-basic-vs-cot.toml"),
            "--policy",
            "scripted",
            "--steps",
            "2",
            "--agents",
            "30",
            "--no-report",
            "--out",
            str(out),
        ],
        check=True,
        capture_output=True,
    )
    run = throng.open_run(out)
    assert run.manifest["scenario"] == "guess"
    assert_equal_tables(run.state(as_="arrow"), pq.read_table(out / "state.parquet"))
    assert run.aggregates().equals(pd.read_csv(out / "aggregates.csv"))
    assert run.aggregates(as_="arrow").equals(pyarrow.csv.read_csv(out / "aggregates.csv"))


def test_a_bad_config_names_its_file_and_line(tmp_path):
    config = tmp_path / "bad.toml"
    config.write_text('name = "x"\nsteps = "ten"\n[scenario]\nname = "energy_market"\n')
    with pytest.raises(throng.ConfigError) as e:
        throng.run(config, policy="scripted")
    assert "bad.toml:2" in str(e.value)


def test_a_bad_flag_is_a_config_error_with_the_command_lines_words(root):
    with pytest.raises(throng.ConfigError) as e:
        throng.run(root / "experiments" / "exp2-regulated.toml", policy="telepathy")
    assert "telepathy" in str(e.value) and "scripted" in str(e.value)


def test_threads_are_set_before_the_process_starts(root):
    with pytest.raises(throng.ConfigError, match="RAYON_NUM_THREADS=2"):
        throng.run(root / "experiments" / "exp2-regulated.toml", policy="scripted", threads=2)


def test_a_damaged_record_is_refused(root, tmp_path):
    out = tmp_path / "damaged"
    run = throng.run(
        root / "experiments" / "exp2-regulated.toml",
        policy="scripted",
        steps=2,
        replicates=1,
        no_report=True,
        out=out,
    )
    with open(out / "decisions.jsonl", "a") as f:
        f.write("{}\n")
    with pytest.raises(throng.ThrongError, match="decisions.jsonl"):
        run.decisions()
    data = bytearray((out / "state.parquet").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (out / "state.parquet").write_bytes(bytes(data))
    with pytest.raises(throng.ThrongError, match="state.parquet"):
        run.state()
    with pytest.raises(throng.ThrongError, match="not a run folder"):
        throng.open_run(tmp_path)
