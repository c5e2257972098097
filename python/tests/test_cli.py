"""The `throng` command that `pip install` puts beside the interpreter: the binary's command line,
running in the package, writing what the binary writes."""

import filecmp
import json
import os
import pathlib
import subprocess
import sys

import throng


def command():
    """The console script of the package installed in this interpreter's environment."""
    path = pathlib.Path(sys.executable).parent / ("throng.exe" if os.name == "nt" else "throng")
    assert path.exists(), f"pip installed no `throng` command beside {sys.executable}"
    return path


def test_pip_installs_the_throng_command(tmp_path):
    out = subprocess.run([str(command()), "--version"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"throng {throng.__version__}"
    # `python -m throng` is the same command.
    module = subprocess.run(
        [sys.executable, "-m", "throng", "--version"], capture_output=True, text=True
    )
    assert module.stdout == out.stdout


def test_the_throng_command_runs_as_the_binary_does(root, tmp_path, throng_bin):
    args = ["run", str(root / "experiments" / "exp2-regulated.toml"), "--policy", "scripted",
            "--steps", "2", "--replicates", "1", "--no-report"]
    ours = subprocess.run(
        [str(command()), *args, "--out", str(tmp_path / "ours")], capture_output=True, text=True
    )
    assert ours.returncode == 0, ours.stderr
    theirs = subprocess.run(
        [str(throng_bin), *args, "--out", str(tmp_path / "theirs")], capture_output=True, text=True
    )
    assert theirs.returncode == 0, theirs.stderr
    assert json.loads((tmp_path / "ours" / "manifest.json").read_text())["status"] == "finished"
    for name in ("decisions.jsonl", "state.parquet", "trades.parquet", "config.toml"):
        assert filecmp.cmp(tmp_path / "ours" / name, tmp_path / "theirs" / name, shallow=False), name


def test_a_mistake_on_the_throng_command_is_the_binarys_error(root, throng_bin):
    args = ["run", str(root / "experiments" / "exp2-regulated.toml"), "--policy", "telepathy"]
    ours = subprocess.run([str(command()), *args], capture_output=True, text=True)
    theirs = subprocess.run([str(throng_bin), *args], capture_output=True, text=True)
    assert ours.returncode == theirs.returncode == 2
    assert ours.stderr == theirs.stderr and "telepathy" in ours.stderr
