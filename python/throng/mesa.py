"""A Mesa model as a throng study: its agents decide through throng's runner (batched, under
the decision's schema, with the scripted policy, policy groups and arms as any study has),
and the run gets a run folder, replicates, records, checkpoints, exact resume and a report.

``throng.mesa.study(ModelClass, ...)`` makes the scenario class; what the Mesa model needs of
its own is small:

- each agent has ``prompt()``, the variables of its role's template (``<role>.jinja``), and
  ``receive(decision)``, which takes the decision throng made for it (the model's reply, valid
  against the schema, or the scripted rule's); ``scripted(rng)`` gives the scripted policy's
  decision (``rng`` draws the cell's own stream), and ``role()`` the agent's role where the
  study has several;
- the model has ``schema`` (the decision's JSON schema; an agent's own ``schema()`` wins), and
  its ``step()`` leaves the deciding to throng: throng hands every agent its decision, then
  calls ``step()``, which does what follows the decisions (scoring, moving, collecting data).
  Optionally ``rules()``, the variables of ``system.jinja`` (``{"step": step}`` without it).

The model is built once per cell, by ``build(population, seed, **knobs)`` (by default
``ModelClass(n_agents=population.size, seed=seed, **knobs)``); ``knobs`` are the
``[scenario]`` table's, over the defaults given. Agents are taken in the order of their
``unique_id``. ``columns`` name agent attributes and ``aggregates_columns`` model attributes
(as a ``mesa.DataCollector``'s reporters do) written every step to ``state.parquet`` and
``aggregates.csv``, with their types (see ``help(throng.Scenario)``). Checkpoints hold the
model, pickled with cloudpickle (``pip install cloudpickle``), and a resumed run continues
from it.
"""

import inspect

from .scenario import scenario as _register

class World:
    """A cell's world: the Mesa model, with its agents in the order throng numbers them (by
    ``unique_id``, taken again after every step, so agents born or removed in one are in the
    next). Checkpoints pickle the model whole with cloudpickle, which writes what pickle cannot
    and Mesa models hold: a ``DataCollector``'s reporter functions."""

    __slots__ = ("model", "agents")

    def __init__(self, model):
        self.model = model
        self.agents = sorted(model.agents, key=lambda a: a.unique_id)

    def __reduce__(self):
        try:
            import cloudpickle
        except ImportError as e:
            raise ImportError(
                "a Mesa study's checkpoints need cloudpickle: pip install cloudpickle "
                "(or throng's `mesa` extra)"
            ) from e
        return (_restore, (cloudpickle.dumps(self.model),))


def _restore(data):
    import cloudpickle

    return World(cloudpickle.loads(data))


def study(
    model_class,
    *,
    name,
    roles=("agent",),
    knobs=None,
    columns=None,
    aggregates_columns=None,
    build=None,
    register=True,
):
    """The throng scenario class running ``model_class`` (a ``mesa.Model``) as the study
    ``name``: configs name it with ``[scenario] name = ...``, and its prompt templates are
    ``system.jinja`` and one ``<role>.jinja`` per role in the config's ``templates`` folder.
    Registered with ``@throng.scenario`` unless ``register=False`` (then pass it to
    ``throng.run(..., scenarios=[...])``)."""
    columns = dict(columns or {})
    aggregates_columns = dict(aggregates_columns or {})
    roles = list(roles)

    def make(population, seed, **given):
        if build is not None:
            return build(population, seed, **given)
        return model_class(n_agents=population.size, seed=seed, **given)

    def __init__(self, table):
        self.knobs = dict(table)

    def init(self, population, rng):
        return World(make(population, rng.integers(0, 2**31), **self.knobs))

    def num_agents(self, world):
        return len(world.agents)

    def turn(self, world, population, agent, step):
        a = world.agents[agent]
        own = getattr(a, "schema", None)
        return a.prompt(), own() if callable(own) else world.model.schema

    def shared_context(self, world, step):
        if hasattr(world.model, "rules"):
            return world.model.rules()
        return {"step": step}

    def scripted(self, world, population, agent, rng):
        a = world.agents[agent]
        if not hasattr(a, "scripted"):
            raise TypeError(
                f"{type(a).__name__} has no `scripted(rng)` method: give the scripted policy's "
                "decision there, or run with policy = \"llm\""
            )
        return a.scripted(rng)

    def resolve(self, world, population, decisions, rng):
        for a, decision in zip(world.agents, decisions):
            if decision is not None:
                a.receive(decision)
        world.model.step()
        return World(world.model)

    def role(self, world, agent):
        a = world.agents[agent]
        return a.role() if hasattr(a, "role") else roles[0]

    def row(self, world, agent, step):
        a = world.agents[agent]
        return {c: getattr(a, c) for c in columns}

    def aggregates(self, world, cell, step):
        return {c: getattr(world.model, c) for c in aggregates_columns}

    methods = {
        "__init__": __init__,
        "init": init,
        "num_agents": num_agents,
        "turn": turn,
        "shared_context": shared_context,
        "scripted": scripted,
        "resolve": resolve,
    }
    if len(roles) > 1:
        methods["role"] = role
    if columns:
        methods["row"] = row
    if aggregates_columns:
        methods["aggregates"] = aggregates
    attributes = {
        "name": name,
        "roles": roles,
        "knobs": dict(knobs or {}),
        "__doc__": f"The Mesa model {model_class.__name__} as the throng study `{name}`.",
        # Run folders record the module that defines the study, so `throng report` and
        # `--resume` import it: the module that made it, whose import makes it again.
        "__module__": _caller_module(),
    }
    if columns:
        attributes["columns"] = columns
    if aggregates_columns:
        attributes["aggregates_columns"] = aggregates_columns
    cls = type(f"{model_class.__name__}Study", (), {**attributes, **methods})
    cls.__qualname__ = cls.__name__
    return _register(cls) if register else cls


def _caller_module():
    """The module that called ``study``: where the class is defined, as far as a run folder
    and an import are concerned."""
    frame = inspect.currentframe()
    try:
        caller = frame.f_back.f_back
        return caller.f_globals.get("__name__", "__main__") if caller else "__main__"
    finally:
        del frame


__all__ = ["World", "study"]
