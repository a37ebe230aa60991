"""The wheel, built and installed into a fresh virtual environment as a user gets it: it claims the import
name `fold` alone, `import fold` works from a folder with an `ad.py` beside the script, the `fold` command
is installed, and the built-in demo runs.

Offline: the wheel is built without build isolation (the test extra brings a setuptools that reads this
pyproject), and installed with --no-deps --no-index into a venv made without pip; NumPy and Numba come from
this environment through a .pth file (no download). Run once by `make test` (the numba run)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "README.md", "fold", "ad", "runtime", "kernels")  # what setuptools reads


def _setuptools_reads_pyproject() -> bool:
    try:
        import setuptools
    except ImportError:
        return False
    major = int(setuptools.__version__.split(".")[0])
    return major >= 77  # `license = "MIT"` (PEP 639) needs setuptools 77


def _run(args: list, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=240, **kwargs)
    assert done.returncode == 0, f"{' '.join(map(str, args))} failed:\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    if not _setuptools_reads_pyproject():
        pytest.skip("needs setuptools >= 77 in this environment (the test extra) to build the wheel offline")
    source = tmp_path_factory.mktemp("source")  # a copy: no stale build/ or egg-info of the checkout gets in
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy(path, source / name)
    dist = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", dist,
          source])
    (built,) = dist.glob("fold-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    env = tmp_path_factory.mktemp("venv")
    _run([sys.executable, "-m", "venv", "--without-pip", env])
    python = env / "bin" / "python"
    purelib = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    import llvmlite
    import numba
    import numpy

    # a .pth line only adds a folder to sys.path: this environment's own .pth files (its editable fold) do not run
    folders = dict.fromkeys(str(Path(m.__file__).resolve().parents[1]) for m in (numpy, numba, llvmlite))
    (Path(purelib) / "_numpy_numba_from_test_env.pth").write_text("\n".join(folders) + "\n")
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "-q", wheel])
    return env


def test_the_wheel_adds_the_import_name_fold_only(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (record,) = [n for n in names if n.endswith(".dist-info/RECORD")]
        recorded = [line.split(",")[0] for line in archive.read(record).decode().splitlines() if line]
    tops = {path.split("/")[0] for path in recorded if ".dist-info/" not in path}
    assert tops == {"fold"}, f"the wheel installs top-level {sorted(tops)}"
    for package in ("fold/ad/__init__.py", "fold/runtime/__init__.py", "fold/kernels/cpu/__init__.py", "fold/cli.py"):
        assert package in recorded


def test_import_fold_beside_a_users_ad_py_and_run_the_demo(venv, tmp_path):
    user = tmp_path / "project"
    user.mkdir()
    for name in ("ad", "runtime", "kernels"):  # a user's modules of the names fold's folders have in the checkout
        (user / f"{name}.py").write_text(f"raise RuntimeError('the user\\'s {name}.py was imported by fold')\n")
    (user / "script.py").write_text(
        "import sys\n"
        "import fold\n"
        "import fold.ad, fold.runtime, fold.kernels\n"
        "print(fold.__version__, fold.__file__)\n"
        "assert not {'ad', 'runtime', 'kernels'} & set(sys.modules), 'a top-level name was imported'\n"
        "from fold.demo import main\n"
        "main(n=3, d=2)\n")
    env = {**os.environ, "FOLD_CACHE_DIR": str(tmp_path / "cache"), "NUMBA_CACHE_DIR": str(tmp_path / "cache" / "numba"),
           "PYTHONPATH": ""}
    done = _run([venv / "bin" / "python", "script.py"], cwd=user, env=env)
    version, location = done.stdout.splitlines()[0].split(" ", 1)
    assert Path(location).resolve().is_relative_to(venv.resolve()), f"fold imported from {location}, not the venv"
    assert version == _project_version()
    assert done.stdout.rstrip().endswith("demo passed")

    info = _run([venv / "bin" / "fold", "info"], cwd=user, env=env)  # the console script
    assert "checkout: none" in info.stdout and f"fold {version}" in info.stdout, info.stdout
    bench = subprocess.run([venv / "bin" / "fold", "bench", "--quick"], cwd=user, env=env, capture_output=True,
                           text=True, timeout=120)
    assert bench.returncode == 2 and "checkout" in bench.stderr


def _project_version() -> str:
    match = re.search(r'^version = "([^"]+)"$', (ROOT / "pyproject.toml").read_text(), re.M)
    assert match, "pyproject.toml has no version line"
    return match.group(1)
