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
from numba import types

import fold
import fold.kernels.cpu as kc
from fold.kernels.cpu import bidirectional, modules
from fold.kernels.cpu.codegen import compile_kernel
from fold.runtime.numba_backend.codegen import compile_scalar_program

ROOT = Path(__file__).resolve().parents[1]
reduce_kernels = importlib.import_module("fold.kernels.cpu.reduce")  # the package exports the function reduce
product_fold = importlib.import_module("fold.kernels.cpu.product_fold")  # and the function product_fold


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


@pytest.mark.parametrize("on_disk", [False, True])
def test_a_parallel_kernels_helpers_compile_once_and_serially(tmp_path, monkeypatch, on_disk) -> None:
    """scan_pair_map's block loops call block_totals and block_scans, product_fold's calls row_blocks: the
    prange bodies are small (Numba's parfor passes copy what they are given). Called with the serial
    typing's argument types, no helper is compiled for the prange index's uint64, each has one compilation
    in a fresh process's memory, and none is parallel."""
    monkeypatch.setenv("FOLD_CACHE_DIR", str(tmp_path) if on_disk else "")
    kc.clear_cache()  # the in-memory kernels do not tell how they were made
    combine = _operator()
    mapper = compile_scalar_program(fold.trace(lambda p, s, y: p * y - s, *(np.float64(1.0),) * 3))
    x, y = np.linspace(0.9, 1.1, 50_000), np.linspace(-1.0, 1.0, 50_000)
    got = kc.scan_pair_map(combine, 1, (1.0,), [x], mapper, 1, [y], block=1000, parallel=True)[0]
    want = kc.scan_pair_map(combine, 1, (1.0,), [x], mapper, 1, [y], block=1000, parallel=False)[0]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    pair = bidirectional.scan_pair_map_kernel(combine, mapper, 1, 1, 0, 1, True, 1000)
    distance = compile_scalar_program(fold.trace(lambda s, p, c: p - 2.0 * s + c, *(np.float64(1.0),) * 3))
    minimum = compile_scalar_program(fold.trace(lambda a, b: fold.minimum(a, b), np.float64(1.0), np.float64(1.0)))
    points, centres = np.linspace(-1, 1, 4000 * 3).reshape(4000, 3), np.linspace(-1, 1, 24).reshape(8, 3)
    nearest = kc.product_fold(distance, minimum, np.inf, points, centres, ("product", "row", "column"),
                              [(points * points).sum(1), (centres * centres).sum(1)], parallel=True)
    np.testing.assert_allclose(nearest, (((points[:, None, :] - centres[None]) ** 2).sum(2)).min(1), rtol=1e-9, atol=1e-12)
    tiles = product_fold.product_fold_kernel(distance, minimum, ("product", "row", "column"), True)
    for kernel, helpers in ((pair, ("block_totals", "block_scans")), (tiles, ("row_blocks",))):
        assert kernel.targetoptions["parallel"] is True
        assert modules.is_content_addressed(kernel) is on_disk
        for name in helpers:
            helper = kernel.py_func.__globals__[name]
            assert not any(t == types.uint64 for sig in helper.signatures for t in sig), (name, helper.signatures)
            if not on_disk:  # on disk the module is shared by its text: an earlier test may have compiled it too
                assert len(helper.signatures) == 1, (name, helper.signatures)
            assert not helper.targetoptions.get("parallel", False)


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
from fold.kernels.cpu.logsumexp import _KERNELS, logsumexp
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
