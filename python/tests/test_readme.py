"""The README's Python examples, run as written: every ```python block of README.md, in order, in
one namespace, in a folder of their own where the repository's `experiments` and `templates` are
at hand (the examples name them relative to the repository's root)."""

import os
import re

import pytest


def blocks(readme):
    return re.findall(r"^```python\n(.*?)^```$", readme, flags=re.S | re.M)


def test_the_readme_has_python_examples(root):
    assert len(blocks((root / "README.md").read_text())) >= 2


def test_the_readmes_python_examples_run_as_written(root, tmp_path, monkeypatch, smollm2):
    for name in ("experiments", "templates"):
        os.symlink(root / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "readme"}
    for i, code in enumerate(blocks((root / "README.md").read_text())):
        try:
            exec(compile(code, f"README.md, python block {i}", "exec"), namespace)
        except Exception as e:
            pytest.fail(f"README.md's python block {i} fails: {type(e).__name__}: {e}\n{code}")
