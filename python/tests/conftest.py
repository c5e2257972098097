"""Shared fixtures: the repository's paths, the `throng` binary the Rust build made (to hold the
package to the command line's output), and the SmolLM2 engine, loaded once per session.

SmolLM2 is fetched into throng's cache on first use. Where it cannot be (no network), the tests
that need it skip with the reason, unless THRONG_REQUIRE_ASSETS=1 (as in CI): then they fail.
"""

import os
import pathlib
import subprocess

import pytest

import throng

ROOT = pathlib.Path(__file__).resolve().parents[2]


def require(what, error):
    if os.environ.get("THRONG_REQUIRE_ASSETS") == "1":
        pytest.fail(f"{what} is required (THRONG_REQUIRE_ASSETS=1): {error}")
    print(f"\n*** SKIPPED: {what} is unavailable: {error} ***")
    pytest.skip(f"{what} is unavailable: {error}")


@pytest.fixture(scope="session")
def root():
    return ROOT


@pytest.fixture(scope="session")
def throng_bin():
    """The `throng` binary of the release build (the README's test command builds it first)."""
    path = ROOT / "target" / "release" / "throng"
    if not path.exists():
        subprocess.run(["cargo", "build", "--release", "--bin", "throng"], cwd=ROOT, check=True)
    return path


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M-Instruct on the CPU, as `throng generate` loads it by default."""
    try:
        return throng.Engine("smollm2-135m-instruct")
    except throng.ModelError as e:
        require("SmolLM2-135M-Instruct", e)
