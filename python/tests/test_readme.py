"""The docs' Python examples, run as written: every ```python block of the book's Python chapter
(docs/src/python.md) and of the README, each document's blocks in order, in one namespace of
their own, in a folder of their own where the repository's `experiments` and `templates` are at
hand (the examples name them relative to the repository's root)."""

import os
import re

import pytest

CHAPTER = "docs/src/python.md"
DOCUMENTS = [CHAPTER, "README.md"]


def blocks(text):
    return re.findall(r"^```python\n(.*?)^```$", text, flags=re.S | re.M)


def test_the_python_chapter_has_python_examples(root):
    assert len(blocks((root / CHAPTER).read_text())) >= 2


@pytest.mark.parametrize("document", DOCUMENTS)
def test_the_docs_python_examples_run_as_written(document, root, tmp_path, monkeypatch, smollm2):
    examples = blocks((root / document).read_text())
    if not examples:
        pytest.skip(f"{document} has no python block")
    for name in ("experiments", "templates"):
        os.symlink(root / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "docs"}
    for i, code in enumerate(examples):
        try:
            exec(compile(code, f"{document}, python block {i}", "exec"), namespace)
        except Exception as e:
            pytest.fail(f"{document}'s python block {i} fails: {type(e).__name__}: {e}\n{code}")
