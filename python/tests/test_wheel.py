"""A wheel of the package installs into a fresh virtualenv in seconds, with the module, the
`throng` command, the types and the dependencies it declares. The wheel is the one
`scripts/test` built (`THRONG_WHEELS`, a folder), or one built here with maturin, which reuses
the build the package was installed from."""

import os
import pathlib
import subprocess
import sys
import venv
import zipfile

import pytest

from conftest import require

import throng


@pytest.fixture(scope="module")
def wheel(root, tmp_path_factory):
    given = os.environ.get("THRONG_WHEELS")
    if given:
        folder = pathlib.Path(given)
    else:
        folder = tmp_path_factory.mktemp("wheels")
        maturin = pathlib.Path(sys.executable).parent / "maturin"
        if not maturin.exists():
            require("maturin (pip install ./python[test])", f"{maturin} is missing")
        # As scripts/test builds it: with the features of the build there is (`mpi`, whose
        # Open MPI the wheel then links from the system rather than carrying it).
        built = subprocess.run(
            [str(maturin), "build", "--release", "--features", "mpi", "--auditwheel", "skip",
             "--interpreter", sys.executable, "--manifest-path",
             str(root / "python" / "Cargo.toml"), "--out", str(folder)],
            capture_output=True,
            text=True,
        )
        assert built.returncode == 0, built.stderr
    wheels = sorted(folder.glob(f"throng-{throng.__version__}-*.whl"))
    assert wheels, f"no wheel of throng {throng.__version__} in {folder}"
    return wheels[-1]


def test_the_wheel_holds_the_types_the_command_and_the_dependencies(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        assert "throng/py.typed" in names and "throng/_throng.pyi" in names
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = z.read(info).decode()
        points = z.read(info.replace("METADATA", "entry_points.txt")).decode()
    assert "Requires-Dist: pyarrow" in metadata and "Requires-Dist: pandas" in metadata
    assert "throng=throng.__main__:main" in points.replace(" ", "")


def test_the_wheel_installs_into_a_fresh_virtualenv(wheel, tmp_path):
    env = tmp_path / "env"
    venv.create(env)
    python = env / "bin" / "python"
    # This pip installs into the fresh environment (which then needs none of its own). The
    # wheel's dependencies (pyarrow, pandas) come from PyPI, which the tests do not reach for.
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--no-index", str(wheel)],
        capture_output=True,
        text=True,
    )
    assert install.returncode == 0, install.stderr
    out = subprocess.run(
        [str(python), "-c", "import throng; print(throng.__version__, throng.Engine)"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == throng.__version__
    command = subprocess.run([str(env / "bin" / "throng"), "--version"], capture_output=True, text=True)
    assert command.stdout.strip() == f"throng {throng.__version__}"
