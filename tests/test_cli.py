"""The `fold` command, run as `python -m fold` in a subprocess (as a user runs it), on temporary cache folders."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fold import cli
from fold.runtime.numba_backend.cache_files import _numba_subpath

ROOT = Path(__file__).resolve().parent.parent
COMPILE_ONE = ("import numpy as np, fold\n"
               "f = lambda x: fold.reduce(lambda a, b: a + b + 0.0314159 * a * b, x, identity=0.0)\n"
               "fold.jit(f, backend='numba')(np.ones(8))\n")


def _fold(args: list[str], cache: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "FOLD_CACHE_DIR": str(cache), "NUMBA_CACHE_DIR": str(cache / "numba")}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_info_names_version_backends_and_cache(tmp_path):
    import fold

    done = _fold(["-m", "fold", "info"], tmp_path, tmp_path)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert f"fold {fold.__version__}" in out
    assert "backends: " in out and "numba" in out.split("backends: ")[1].splitlines()[0]
    assert "threads" in out and "cuda: " in out
    assert f"{tmp_path / 'kernels'}: 0 files" in out, out


def test_cache_clear_removes_folds_kernels_and_nothing_else(tmp_path):
    cache = tmp_path / "cache"
    compiled = _fold(["-c", COMPILE_ONE], cache, tmp_path)
    assert compiled.returncode == 0, compiled.stderr
    generated = cache / "kernels"
    numba_entries = cache / "numba" / _numba_subpath(generated)
    assert list(generated.glob("fold_gen_*.py")) and list(numba_entries.glob("fold_gen_*.nb[ic]"))
    # what is not fold's: a file of the user's in each folder, and Numba's cache of a user's own function
    keep = [generated / "notes.txt", numba_entries / "notes.txt", cache / "numba" / "mine_0123" / "mine.f-1.py311.nbi"]
    for path in keep:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("keep me")

    info = _fold(["-m", "fold", "info"], cache, tmp_path)
    assert f"{generated}: 0 files" not in info.stdout and f"{generated}: " in info.stdout, info.stdout
    done = _fold(["-m", "fold", "cache", "clear"], cache, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "fold cache clear: removed" in done.stdout and "removed 0 files" not in done.stdout, done.stdout
    assert not list(generated.rglob("fold_gen_*")) and not list(numba_entries.glob("*.nb[ic]"))
    assert all(path.read_text() == "keep me" for path in keep)


def test_a_bad_subcommand_is_an_error_naming_the_choices(tmp_path):
    done = _fold(["-m", "fold", "compile-everything"], tmp_path, tmp_path)
    assert done.returncode == 2
    assert "invalid choice: 'compile-everything'" in done.stderr and "info" in done.stderr, done.stderr


def test_bench_outside_a_checkout_says_it_needs_one(monkeypatch, capsys):
    monkeypatch.setattr(cli, "checkout_root", lambda: None)
    assert cli.main(["bench", "--quick"]) == 2
    assert "run it from a checkout" in capsys.readouterr().err


def test_this_checkout_is_found():
    assert cli.checkout_root() == ROOT


def test_demo_runs_and_checks_itself(capsys):
    assert cli.main(["demo", "--rows", "3", "--features", "2"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("demo passed")
