"""The package's types: `py.typed` and the extension module's stubs shipped, every stub true to
the module (its names, and each signature's parameters and defaults), signatures that show their
defaults, and the exceptions as the package's own (`throng.RunError`)."""

import ast
import inspect
import pathlib

import pytest

import throng
from throng import _throng

PACKAGE = pathlib.Path(throng.__file__).parent
EXCEPTIONS = [
    "ThrongError",
    "ModelError",
    "RequestError",
    "SchemaError",
    "PromptTooLongError",
    "CutOffError",
    "ConfigError",
    "RunError",
    "ArgumentError",
    "ScenarioProblem",
    "Rejected",
]


def stub():
    return ast.parse((PACKAGE / "_throng.pyi").read_text())


def test_the_package_says_it_is_typed_and_ships_its_stubs():
    assert (PACKAGE / "py.typed").is_file()
    assert (PACKAGE / "_throng.pyi").is_file()


def test_the_stubs_name_everything_the_module_has_and_nothing_else():
    declared = set()
    for node in stub().body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            declared.add(node.name)
        elif isinstance(node, ast.AnnAssign):
            declared.add(node.target.id)
    public = {n for n in dir(_throng) if not n.startswith("_") or n == "__version__"}
    assert declared == public


def parameters(function):
    """(name, kind, default) of each parameter of a stub's function, `self` left out."""
    args = function.args
    out = []
    positional = args.posonlyargs + args.args
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    for arg, default in zip(positional, defaults):
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        out.append((arg.arg, kind, default))
    for arg, default in zip(args.kwonlyargs, args.kw_defaults):
        out.append((arg.arg, inspect.Parameter.KEYWORD_ONLY, default))
    value = lambda d: inspect.Parameter.empty if d is None else ast.literal_eval(d)
    return [(n, k, value(d)) for n, k, d in out if n != "self"]


def real(signature):
    return [
        (p.name, p.kind, p.default) for p in signature.parameters.values() if p.name != "self"
    ]


def stubbed_functions():
    """(qualified name, the real object's signature, the stub's function) for every function
    and method of the stubs but the dunders, `__init__` standing for its class."""
    for node in stub().body:
        if isinstance(node, ast.FunctionDef):
            yield node.name, getattr(_throng, node.name), node
        elif isinstance(node, ast.ClassDef):
            cls = getattr(_throng, node.name)
            for item in node.body:
                if not isinstance(item, ast.FunctionDef):
                    continue
                if any(isinstance(d, ast.Name) and d.id == "property" for d in item.decorator_list):
                    assert hasattr(cls, item.name), f"{node.name}.{item.name}"
                    continue
                if item.name == "__init__":
                    yield node.name, cls, item
                elif not item.name.startswith("__"):
                    yield f"{node.name}.{item.name}", getattr(cls, item.name), item


@pytest.mark.parametrize(
    "name, obj, function", [pytest.param(*f, id=f[0]) for f in stubbed_functions()]
)
def test_each_stub_has_its_functions_real_parameters_and_defaults(name, obj, function):
    assert real(inspect.signature(obj)) == parameters(function), name


def test_signatures_show_their_defaults():
    engine = inspect.signature(throng.Engine).parameters
    assert engine["model"].default == throng.DEFAULT_MODEL
    for method in (throng.Engine, throng.Engine.decide, throng.Engine.stream, throng.Engine.generate):
        for p in inspect.signature(method).parameters.values():
            assert p.default is not Ellipsis, (method, p)
    decide = inspect.signature(throng.Engine.decide).parameters
    assert decide["max_tokens"].default == 256 and decide["on_length"].default == "raise"


@pytest.mark.parametrize("name", EXCEPTIONS)
def test_each_exception_is_the_packages_own(name):
    cls = getattr(throng, name)
    assert name in throng.__all__
    assert cls.__module__ == "throng" and cls.__name__ == name
    assert issubclass(cls, throng.ThrongError)


def test_an_argument_error_is_also_what_python_code_catches_for_a_bad_argument():
    assert issubclass(throng.ArgumentError, ValueError)
    assert issubclass(throng.ArgumentError, TypeError)
    assert issubclass(throng.CutOffError, throng.RequestError)
