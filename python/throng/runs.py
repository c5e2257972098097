"""Runs: ``throng.run`` runs a config through the library, as the command line does, and ``throng.open_run`` reads a
run folder's records. Parquet tables come from throng's own reader (checksums verified) as
pyarrow Tables that share its buffers; CSV and JSON Lines files are checked against the
manifest's checksums before they are read."""

import json
import os

from . import _throng
from .scenario import import_defining, registered


def run(
    config=None,
    *,
    resume=None,
    out=None,
    policy=None,
    steps=None,
    replicates=None,
    agents=None,
    model=None,
    device=None,
    weights=None,
    no_report=False,
    stop_after=None,
    reuse=None,
    split=None,
    devices=None,
    rank_timeout=None,
    stop_timeout=None,
    serve=None,
    public=False,
    tokenizer=None,
    kv_memory=None,
    kv_format=None,
    max_batch_tokens=None,
    max_seqs=None,
    no_prefix_cache=False,
    kv_policy=None,
    threads=None,
    scenarios=(),
):
    """Runs the experiment ``config`` (or resumes the run folder ``resume``), as
    ``throng run`` does, with its overrides; returns the ``Run``.

    Keyword arguments are the command's options, by name with ``_`` for ``-``:
    ``policy="scripted"``, ``steps=5``, ``agents=[20, 100]``, ``out="runs/x"``, ``model=...``,
    ``stop_after=3``, ``reuse=["runs/a"]``, ``kv_memory="2GiB"``, ``serve=True``. A bad one
    raises ``ConfigError`` naming it. ``scenarios`` adds Python scenario classes to those
    registered with ``@throng.scenario``.

    Progress is shown on standard error. A Ctrl-C pauses the run after the current step
    (resumable with ``resume=``) and raises ``KeyboardInterrupt``, whose message says how to
    resume and whose ``folder`` is the run's folder. A run that stops on an error is marked
    ``failed`` in its manifest, with the error, and raises it (``RunError``, with ``folder``,
    for an exception of a Python scenario).
    """
    if resume is not None:
        import_defining(os.fspath(resume))
    classes = registered() + [c for c in scenarios if c not in registered()]
    folder, _finished = _throng.run(
        None if config is None else os.fspath(config),
        classes,
        resume=resume,
        out=out,
        policy=policy,
        steps=steps,
        replicates=replicates,
        agents=agents,
        model=model,
        device=device,
        weights=weights,
        no_report=no_report,
        stop_after=stop_after,
        reuse=reuse,
        split=split,
        devices=devices,
        rank_timeout=rank_timeout,
        stop_timeout=stop_timeout,
        serve=serve,
        public=public,
        tokenizer=tokenizer,
        kv_memory=kv_memory,
        kv_format=kv_format,
        max_batch_tokens=max_batch_tokens,
        max_seqs=max_seqs,
        no_prefix_cache=no_prefix_cache,
        kv_policy=kv_policy,
        threads=threads,
    )
    return Run(folder, scenarios=classes)


def open_run(folder, scenarios=()):
    """The run in ``folder``, to read (finished, paused, or still running)."""
    return Run(folder, scenarios=scenarios)


def _frame(table, as_):
    if as_ == "arrow":
        return table
    if as_ == "pandas":
        return table.to_pandas()
    raise ValueError(f"as_={as_!r}: give 'pandas' or 'arrow'")


class Run:
    """A run folder: its manifest, config and records.

    Tables come as pandas DataFrames (``as_="pandas"``, the default) or pyarrow Tables
    (``as_="arrow"``, no copy of throng's buffers)."""

    def __init__(self, folder, scenarios=()):
        self.folder = os.fspath(folder)
        if not os.path.isfile(os.path.join(self.folder, "manifest.json")):
            raise _throng.ThrongError(
                f"{self.folder} is not a run folder (it has no manifest.json): give the folder "
                "`throng run` wrote"
            )
        self._scenarios = list(scenarios)

    def __repr__(self):
        m = self.manifest
        return f"throng.Run({self.folder!r}, scenario={m.get('scenario')!r}, status={m.get('status')!r})"

    def _path(self, name):
        return os.path.join(self.folder, name)

    @property
    def manifest(self):
        """``manifest.json`` as a dict: status, scenario, model, seeds, counters, timing."""
        with open(self._path("manifest.json"), encoding="utf-8") as f:
            return json.load(f)

    @property
    def status(self):
        """``running``, ``paused``, ``finished`` or ``failed``."""
        return self.manifest.get("status")

    @property
    def config(self):
        """The config the run was made with (overrides applied), as TOML text."""
        with open(self._path("config.toml"), encoding="utf-8") as f:
            return f.read()

    def tables(self):
        """The names of the Parquet tables the run has written (``state``, ``groups``, a
        scenario's own)."""
        names = set()
        for entry in os.listdir(self.folder):
            for suffix in (".parquet", ".parts"):
                if entry.endswith(suffix):
                    names.add(entry[: -len(suffix)])
        return sorted(n for n in names if _throng.has_table(self.folder, n))

    def table(self, name, as_="pandas"):
        """The Parquet table ``name``: joined once the run has finished, its parts so far
        before."""
        return _frame(_throng.read_table(self.folder, name), as_)

    def state(self, as_="pandas"):
        """One row per agent, cell and step: the keys, then the scenario's columns."""
        return self.table("state", as_)

    def groups(self, as_="pandas"):
        """Per group level, group, cell and step: the means of the state's numeric columns."""
        return self.table("groups", as_)

    def _csv(self, name, as_):
        if not os.path.isfile(self._path(name)):
            raise _throng.ThrongError(
                f"{self.folder} has no {name} (its scenario, "
                f"{self.manifest.get('scenario')}, writes none)"
            )
        _throng.verify(self.folder, name)
        if as_ == "pandas":
            import pandas

            return pandas.read_csv(self._path(name))
        import pyarrow.csv

        return _frame(pyarrow.csv.read_csv(self._path(name)), as_)

    def aggregates(self, as_="pandas"):
        """The scenario's per-cell aggregates, one row per cell and step."""
        return self._csv("aggregates.csv", as_)

    def steps(self, as_="pandas"):
        """Timing and counts per step: decisions, tokens, seconds by phase."""
        return self._csv("steps.csv", as_)

    def _jsonl(self, name):
        _throng.verify(self.folder, name)
        with open(self._path(name), encoding="utf-8") as f:
            # A line being written when the run was killed is not a record yet.
            return [json.loads(line) for line in f if line.endswith("\n") and line.strip()]

    def decisions(self, as_="pandas", flatten=True):
        """Every recorded decision: who, when, the model's reply and the decision taken.
        With ``flatten``, a decision's fields become columns (``decision.local``)."""
        import pyarrow as pa

        table = pa.Table.from_pylist(self._jsonl("decisions.jsonl"))
        if flatten:
            while any(pa.types.is_struct(t) for t in table.schema.types):
                table = table.flatten()
        return _frame(table, as_)

    def cells(self):
        """Each cell's description (``describe`` of its scenario), as dicts."""
        return self._jsonl("cells.jsonl")

    def report(self):
        """Writes the report (``report.html``, figures, tables) and returns its key numbers as
        text. A scenario written in Python is imported from the module the run recorded,
        when it is not registered already."""
        import_defining(self.folder)
        classes = registered() + [c for c in self._scenarios if c not in registered()]
        return _throng.report(self.folder, classes)

    @property
    def report_path(self):
        return self._path("report.html")
