"""throng from Python: LLM-driven agent-based simulations with the model inside the process.

Three ways in:

- ``throng.Engine``: a model loaded once; ``engine.decide(prompts, schema)`` decides a whole
  list of prompts as one continuous batch, every reply valid against the schema.
- ``throng.run(config, ...)``: runs an experiment config as ``throng run`` does, and
  ``throng.open_run(folder)`` reads a run's records as pandas DataFrames or pyarrow Tables.
- ``@throng.scenario``: a study written in Python (see ``throng.Scenario``), run by throng's
  runner with the same run folder, checkpoints, exact resume and report as a built-in one.

Every error is a ``throng.ThrongError``, carrying throng's message: what is wrong, and the fix.
``pip install`` also installs the ``throng`` command, the command line of the ``throng`` binary.
"""

from . import _throng
from ._throng import (
    DEFAULT_MODEL,
    ArgumentError,
    ConfigError,
    CutOffError,
    Engine,
    ModelError,
    Population,
    PromptTooLongError,
    RequestError,
    Rng,
    RunError,
    SchemaError,
    Stream,
    ThrongError,
    __version__,
)


class ScenarioProblem(_throng.ScenarioProblem):
    """A knob or population a scenario class refuses, raised by its ``__init__`` or
    ``check_population``: throng reports it at the line of the config that sets ``field``
    (``""``: the whole ``[scenario]`` table; ``"agents"``: the population's size, or
    ``--agents``)."""

    def __init__(self, field, message):
        super().__init__(field, message)
        self.field = field
        self.message = message

    def __str__(self):
        return f"field `{self.field}`: {self.message}" if self.field else self.message


class Rejected(_throng.Rejected):
    """A model's reply a scenario's ``parse`` refuses; the agent keeps ``no_change``, and the
    decisions log says why."""

    def __init__(self, field, reason):
        super().__init__(field, reason)
        self.field = field
        self.reason = reason

    def __str__(self):
        return f"{self.field}: {self.reason}" if self.field else self.reason

from .runs import Run, open_run, run
from .scenario import Scenario, registered, scenario

__all__ = [
    "DEFAULT_MODEL",
    "ArgumentError",
    "ConfigError",
    "CutOffError",
    "Engine",
    "ModelError",
    "Population",
    "PromptTooLongError",
    "Rejected",
    "RequestError",
    "Rng",
    "Run",
    "RunError",
    "Scenario",
    "SchemaError",
    "ScenarioProblem",
    "Stream",
    "ThrongError",
    "__version__",
    "open_run",
    "registered",
    "run",
    "scenario",
]
