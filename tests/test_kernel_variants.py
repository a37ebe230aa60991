"""A kernel compiled serially and in parallel from one source stays two kernels, in a process and in
Numba's disk cache. Numba names a cache entry by the function and its signature, not by the njit options,
and fold's generated modules are one module per text: before these checks, whichever variant came first
(often the serial one, from a small input) served both, and a big input ran on one thread."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fold
from kernels.cpu import modules
from kernels.cpu.codegen import compile_kernel
from runtime.numba_backend.codegen import compile_scalar_program

ROOT = Path(__file__).resolve().parents[1]
reduce_kernels = importlib.import_module("kernels.cpu.reduce")  # the package exports the function reduce


@pytest.fixture
def disk_cache(tmp_path, monkeypatch):
    """Generated kernels as content-addressed modules on disk (where the variants used to collide)."""
    monkeypatch.setenv("FOLD_CACHE_DIR", str(tmp_path))
    return tmp_path


def _operator():
    """A content-addressed combine (so that kernels built on it are generated modules too)."""
    return compile_scalar_program(fold.trace(lambda a, b: a * b + 0.25 * a, np.float64(1.0), np.float64(1.0)))


@pytest.mark.parametrize("first", [False, True])
def test_serial_and_parallel_fold_kernels_are_two_kernels(disk_cache, first) -> None:
    combine = _operator()
    kernels = {parallel: reduce_kernels.fold_kernel(combine, 1, parallel=parallel) for parallel in (first, not first)}
    assert kernels[True] is not kernels[False]
    assert kernels[True].targetoptions["parallel"] is True
    assert not kernels[False].targetoptions.get("parallel", False)
    assert modules.is_content_addressed(kernels[True]) and modules.is_content_addressed(kernels[False])
    x = np.linspace(0.5, 1.5, 1 << 16)
    serial = reduce_kernels.reduce(combine, 1, [1.0], [x], chunks=1)
    parallel = reduce_kernels.reduce(combine, 1, [1.0], [x], chunks=2)
    np.testing.assert_allclose(parallel, serial, rtol=1e-12)


def test_compile_kernel_keeps_each_variants_options(disk_cache) -> None:
    source = "def kernel(x):\n    total = 0.0\n    for i in prange(x.shape[0]):\n        total += x[i]\n    return total\n"
    env = {"combine": _operator()}
    variants = {(parallel, fm): compile_kernel(("variants test", parallel, fm), lambda: source, env, parallel=parallel,
                                               fastmath={"reassoc"} if fm else None)
                for parallel in (False, True) for fm in (False, True)}
    assert len({id(k) for k in variants.values()}) == 4
    for (parallel, fm), kernel in variants.items():
        assert kernel.targetoptions.get("parallel", False) is parallel
        assert bool(kernel.targetoptions.get("fastmath")) is fm
        assert kernel(np.ones(10)) == 10.0


def test_load_module_makes_one_text_with_other_options_another_module(disk_cache) -> None:
    source = "def kernel(x):\n    return x + 1\n"
    module = modules.load_module(source, {"kernel": {"parallel": False}})
    assert modules.load_module(source, {"kernel": {"parallel": False}}) is module
    other = modules.load_module(source, {"kernel": {"parallel": True}})
    assert other is not module and other.__name__ != module.__name__
    assert other.kernel.targetoptions["parallel"] is True and not module.kernel.targetoptions.get("parallel", False)
    same = modules.load_module(source, {"kernel": {"fastmath": {"reassoc", "contract"}}})
    assert modules.load_module(source, {"kernel": {"fastmath": {"contract", "reassoc"}}}) is same


# Runs logsumexp in a fresh process on the cache in argv[1]: on 100 elements (the serial kernel) or on 2^20
# (the parallel one); prints that kernel's cache hits and misses.
CHILD = """
import json, sys
import numpy as np
from kernels.cpu.logsumexp import _KERNELS, logsumexp
parallel = sys.argv[2] == "parallel"
logsumexp(np.linspace(-1.0, 1.0, (1 << 20) if parallel else 100), chunks=2 if parallel else 1)
stats = _KERNELS[parallel].stats
print(json.dumps([sum(stats.cache_hits.values()), sum(stats.cache_misses.values())]))
"""


def _run_child(cache: Path, variant: str) -> list[int]:
    env = {"NUMBA_CACHE_DIR": str(cache), "FOLD_CACHE_DIR": "", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", CHILD, str(cache), variant], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_serial_kernels_cache_entry_is_not_loaded_as_the_parallel_one(tmp_path) -> None:
    assert _run_child(tmp_path, "serial") == [0, 1]  # compiled and saved
    assert _run_child(tmp_path, "parallel") == [0, 1]  # its own entry: compiled, not the serial one loaded
    assert _run_child(tmp_path, "parallel") == [1, 0]
    assert _run_child(tmp_path, "serial") == [1, 0]
