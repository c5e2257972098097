"""Types of the extension module ``throng._throng`` (python/src), which ``throng`` re-exports.
python/tests/test_typing.py holds every name and signature here to the module's own."""

import os
from typing import Any, Iterator, Literal, Optional, Sequence, Union

import pyarrow

__version__: str
DEFAULT_MODEL: str

Message = dict[str, str]
Prompt = Union[str, list[Message]]
Result = dict[str, Any]
StrPath = Union[str, "os.PathLike[str]"]

class ThrongError(Exception): ...
class ModelError(ThrongError): ...
class RequestError(ThrongError): ...
class SchemaError(RequestError): ...
class PromptTooLongError(RequestError): ...
class CutOffError(RequestError): ...
class ConfigError(ThrongError): ...
class RunError(ThrongError): ...
class ArgumentError(ThrongError, ValueError, TypeError): ...
class ScenarioProblem(ConfigError): ...
class Rejected(ThrongError): ...

class Engine:
    def __init__(
        self,
        model: StrPath = "smollm2-135m-instruct",
        *,
        device: str = "cpu",
        weights: Literal["auto", "native", "f32", "f16", "bf16", "q8_0", "int8"] = "auto",
        kv_format: Literal["auto", "model", "f32", "f16"] = "auto",
        kv_memory: Union[str, int, None] = None,
        max_seqs: int = 256,
        max_batch_tokens: Optional[int] = None,
        prefix_cache: bool = True,
        tokenizer: Optional[StrPath] = None,
    ) -> None: ...
    @property
    def model(self) -> str: ...
    @property
    def weights(self) -> str: ...
    @property
    def max_context(self) -> int: ...
    def decide(
        self,
        prompts: Sequence[Prompt],
        schema: Optional[dict[str, Any]] = None,
        *,
        temperature: float = 0.0,
        seed: Union[int, Sequence[int], None] = None,
        max_tokens: int = 256,
        top_p: float = 1.0,
        top_k: Optional[int] = None,
        system: Optional[str] = None,
        on_length: Literal["raise", "none"] = "raise",
    ) -> list[Result]: ...
    def stream(
        self,
        prompts: Sequence[Prompt],
        schema: Optional[dict[str, Any]] = None,
        *,
        temperature: float = 0.0,
        seed: Union[int, Sequence[int], None] = None,
        max_tokens: int = 256,
        top_p: float = 1.0,
        top_k: Optional[int] = None,
        system: Optional[str] = None,
    ) -> "Stream": ...
    def generate(
        self,
        requests: Sequence[Union[dict[str, Any], str]],
        *,
        max_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: Optional[int] = None,
        seed: int = 0,
    ) -> list[Result]: ...

class Stream:
    def __iter__(self) -> Iterator[Result]: ...
    def __next__(self) -> Result: ...

Level = Union[int, str]

class Population:
    @property
    def size(self) -> int: ...
    @property
    def levels(self) -> list[str]: ...
    def group_of(self, level: Level, agent: int) -> int: ...
    def num_groups(self, level: Level) -> int: ...
    def group_size(self, level: Level, group: int) -> int: ...
    def group_label(self, level: Level, group: int) -> str: ...
    def members(self, level: Level, group: int) -> list[int]: ...
    def path(self, agent: int) -> list[tuple[int, int]]: ...
    @property
    def attributes(self) -> list[str]: ...
    def profile(self, agent: int) -> list[tuple[str, str | int | float]]: ...
    def attribute(self, agent: int, name: str) -> str | int | float: ...
    def persona(self, agent: int) -> Optional[str]: ...

class Rng:
    def random(self) -> float: ...
    def uniform(self, low: float, high: float) -> float: ...
    def integers(self, low: int, high: int) -> int: ...
    def bernoulli(self, p: float) -> bool: ...

def run(
    config: StrPath | None,
    classes: Sequence[type],
    *,
    resume: StrPath | None = None,
    out: StrPath | None = None,
    policy: str | None = None,
    steps: int | None = None,
    replicates: int | None = None,
    agents: int | Sequence[int] | None = None,
    model: str | None = None,
    device: str | None = None,
    weights: str | None = None,
    no_report: bool | None = None,
    stop_after: int | None = None,
    reuse: StrPath | Sequence[StrPath] | None = None,
    split: str | None = None,
    devices: str | Sequence[str] | None = None,
    rank_timeout: int | None = None,
    stop_timeout: int | None = None,
    serve: bool | str | None = None,
    public: bool | None = None,
    tokenizer: StrPath | None = None,
    kv_memory: int | str | None = None,
    kv_format: str | None = None,
    max_batch_tokens: int | None = None,
    max_seqs: int | None = None,
    no_prefix_cache: bool | None = None,
    kv_policy: str | None = None,
    threads: int | None = None,
) -> tuple[str, bool]: ...
def read_table(dir: StrPath, name: str) -> pyarrow.Table: ...
def has_table(dir: StrPath, name: str) -> bool: ...
def verify(dir: StrPath, name: str) -> None: ...
def report(dir: StrPath, classes: Sequence[type]) -> str: ...
def main(argv: Sequence[str], classes: Sequence[type] = ...) -> int: ...
