"""Scenarios written in Python: the protocol (``throng.Scenario``) and their registration
(``@throng.scenario``), and the import of the module a run folder records as defining its
scenario."""

import importlib
import importlib.util
import json
import os
import sys

_REGISTERED = []


def scenario(cls):
    """Registers a scenario class for ``throng.run`` and ``Run.report``; returns it as is."""
    for attribute in ("name", "roles"):
        if not hasattr(cls, attribute):
            raise TypeError(f"scenario class {cls.__name__} has no `{attribute}`")
    _REGISTERED[:] = [c for c in _REGISTERED if c.name != cls.name]
    _REGISTERED.append(cls)
    return cls


def registered():
    """The scenario classes registered with ``@throng.scenario``."""
    return list(_REGISTERED)


def import_module(name):
    """Imports ``name``, a module (``ultimatum``, found as ``import`` finds it, the current
    folder first) or a ``.py`` file, so that its ``@throng.scenario`` classes register."""
    if name.endswith(".py") or os.sep in name:
        path = os.path.abspath(name)
        module = os.path.splitext(os.path.basename(path))[0]
        if module in sys.modules and getattr(sys.modules[module], "__file__", None) == path:
            return sys.modules[module]
        spec = importlib.util.spec_from_file_location(module, path)
        if spec is None:
            raise ImportError(f"{name} is not a Python file to import")
        loaded = importlib.util.module_from_spec(spec)
        sys.modules[module] = loaded
        spec.loader.exec_module(loaded)
        return loaded
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    return importlib.import_module(name)


def import_defining(folder):
    """Imports the module that the run in ``folder`` records as defining its scenario (its
    manifest's ``defined_in``), unless a class of that name is registered already. A module
    that cannot be imported is left to the report's or the resume's error, which names it."""
    try:
        with open(os.path.join(folder, "manifest.json"), encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        return
    origin = manifest.get("defined_in")
    if not origin or any(c.name == manifest.get("scenario") for c in _REGISTERED):
        return
    module, file = origin.get("module"), origin.get("file")
    # A script run as such is `__main__`, which names no module to import: its file does.
    # A module is imported by name where that finds it, else from the file it was read from.
    tries = [file] if module == "__main__" else [module, file]
    for name in tries:
        if not name:
            continue
        try:
            import_module(name)
            return
        except (ImportError, OSError, SyntaxError):
            continue


class Scenario:
    """A scenario written in Python: the protocol a class follows (subclassing this is optional).

    A scenario is a class. throng makes one instance per arm of a config, from the arm's
    ``[scenario]`` table (the base table with the arm's changes, ``name`` left out), and calls
    its methods as the run goes. Register it with ``@throng.scenario``, or pass it to
    ``throng.run(..., scenarios=[...])``; a config then names it with ``[scenario] name = ...``.
    Its prompt templates are found as a built-in scenario's are: ``system.jinja`` and one
    ``<role>.jinja`` per role, in the config's ``templates`` folder (by default
    ``templates/<name>`` beside the config's folder).

    Class attributes:

    - ``name``: the name configs use.
    - ``roles``: the roles agents play, e.g. ``["citizen"]``.
    - ``knobs``: the knobs its ``[scenario]`` table may set, each to its default
      (``{"endowment": 20}``; a list of names for knobs without one). ``__init__`` gets the
      defaults with the table's knobs over them; a knob it does not declare is refused at its
      line of the config, as a Rust scenario refuses a field its type lacks. None without it.
    - ``check_scripted`` (``True`` unless set): the ``scripted`` policy's decisions are held to
      the schema of the agent's turn, as a model's replies are, and one outside it stops the run
      naming the agent, the step and what is wrong. Set it to ``False`` for a class whose
      ``parse`` gives decisions of another shape than the replies.
    - ``columns`` (with ``row``): the state table's own columns, name to type: ``float64``,
      ``float32``, ``int64``, ``int32``, ``uint32``, ``uint64``, ``bool``, ``str``; a ``?`` after
      the type allows None. throng puts its keys first (arm, population, replicate, step, agent,
      group levels, attributes).
    - ``aggregates_columns`` (with ``aggregates``): one row per cell and step, after the keys
      arm, population, replicate and step; written to ``aggregates.csv``.
    - ``tables`` (with ``table``): tables of its own, name to columns (a dict as ``columns``),
      each written as ``<name>.parquet`` with the same keys first: long-format data such as
      who traded with whom.

    Methods (``population`` and ``rng`` are lent for the call only; keep copies of what you need
    in the world):

    - ``__init__(self, knobs)``: the arm's table as a dict (over the ``knobs`` defaults); raise
      ``throng.ScenarioProblem(field, message)`` to refuse a knob's value (reported at its line
      of the config).
    - ``init(self, population, rng) -> world``: a cell's world at step 0. Any picklable object:
      checkpoints hold its pickle, and a resumed run starts from it.
    - ``num_agents(self, world) -> int``.
    - ``turn(self, world, population, agent, step) -> (context, schema)``: the variables of the
      agent's role template, and the JSON schema its decision must satisfy (return the same
      schema object for turns of the same shape: it is compiled once).
    - ``scripted(self, world, population, agent, rng) -> decision``: the rule-based decision of
      the ``scripted`` policy (a JSON-like dict, valid against the turn's schema).
    - ``resolve(self, world, population, decisions, rng)``: applies every agent's decision at once
      (``None``: sat out); change the world in place, or return the new one.

    Optional methods: ``shared_context(world, step)`` (the variables of ``system.jinja``;
    ``{"step": step}`` without it), ``parse(world, agent, value)`` (a model's reply to a decision,
    or ``(decision, clamps)``; raise ``throng.Rejected(field, reason)`` or ``ValueError`` to
    refuse it; without it the reply is the decision), ``no_change(world, agent)`` (the decision of
    an agent whose reply failed; ``None`` without it), ``acts(world, agent)``, ``role(world,
    agent)``, ``react(world, population, group)`` (after ``resolve``, for every group of every
    level, innermost first; ``group`` is a dict of ``level``, ``level_name``, ``index``,
    ``members``, ``children``), ``row(world, agent, step)`` (a dict of ``columns``, or None),
    ``aggregates(world, cell, step)`` (a dict of ``aggregates_columns``), ``table(name,
    world, cell, step)`` (a list of rows, dicts of that table's columns), ``describe(world)``
    (written once per cell to ``cells.jsonl``), ``check_population(spec)`` (``spec`` has the
    ``levels`` and ``attributes`` names and the ``sizes``, every number of agents the run has:
    raise ``ScenarioProblem("agents", ...)`` for a size the scenario cannot hold).

    An exception raised by a method stops the run, keeping its finished steps: the run's
    manifest says ``failed``, with the exception and its traceback's last lines, and
    ``throng.run`` raises ``throng.RunError`` (its ``__cause__`` the exception, its ``folder``
    the run's folder). Fix the code and resume with ``throng.run(resume=folder)``.

    ``Rng`` draws from the cell's own stream, as a Rust scenario's ``rng`` does: ``random()``,
    ``uniform(low, high)`` (both ends included), ``integers(low, high)`` (high excluded),
    ``bernoulli(p)``.
    """

    name = None
    roles = ()
    knobs = {}

    def __init__(self, knobs):
        self.knobs = dict(knobs)

    def init(self, population, rng):
        raise NotImplementedError("init(population, rng) -> world")

    def num_agents(self, world):
        raise NotImplementedError("num_agents(world) -> int")

    def turn(self, world, population, agent, step):
        raise NotImplementedError("turn(world, population, agent, step) -> (context, schema)")

    def scripted(self, world, population, agent, rng):
        raise NotImplementedError("scripted(world, population, agent, rng) -> decision")

    def resolve(self, world, population, decisions, rng):
        raise NotImplementedError("resolve(world, population, decisions, rng)")
