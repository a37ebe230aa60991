"""Fault injection: what fold does when its disk cache is damaged, when processes and threads share its
compiled code, when an allocation cannot be made, and when inputs sit at the edges of the monoids.

Each cache test fills a cache in one process, damages one kind of file, and checks that the next process
(a subprocess, as a user's next run) gets the right answer, repairs the cache (a third process runs without
any warning) and warns once at most."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import fold

ROOT = Path(__file__).resolve().parents[1]

# The program: a product of 1..5 with a user operator, compiled into a generated module on the
# numba backend. Prints the answer and fold's warnings as JSON. With argv[1] == "read-only", every write
# under the cache folders fails as on a read-only file system (the suite may run as root, whom chmod does
# not stop), and the test checks that nothing is written anywhere else either.
CHILD = r"""
import builtins, errno, json, os, sys, warnings
roots = (os.environ["FOLD_CACHE_DIR"], os.environ["NUMBA_CACHE_DIR"])
if sys.argv[1] == "read-only":
    def refused(path):
        return str(os.path.abspath(os.fspath(path))).startswith(roots)
    def deny(path):
        raise PermissionError(errno.EROFS, "Read-only file system", str(path))
    _open, _os_open, _mkdir, _replace = builtins.open, os.open, os.mkdir, os.replace
    def open_(file, mode="r", *args, **kwargs):
        if isinstance(file, (str, bytes, os.PathLike)) and any(c in mode for c in "wax+") and refused(file):
            deny(file)
        return _open(file, mode, *args, **kwargs)
    def os_open(path, flags, *args, **kwargs):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT) and refused(path):
            deny(path)
        return _os_open(path, flags, *args, **kwargs)
    def mkdir(path, *args, **kwargs):
        if refused(path):
            deny(path)
        return _mkdir(path, *args, **kwargs)
    def replace(src, dst, *args, **kwargs):
        if refused(dst):
            deny(dst)
        return _replace(src, dst, *args, **kwargs)
    builtins.open, os.open, os.mkdir, os.replace = open_, os_open, mkdir, replace
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import numpy as np
    import fold
    f = lambda a: fold.reduce(lambda p, q: p * q * 1.0, a, identity=1.0)
    y = fold.jit(f, backend="numba")(np.arange(1.0, 6.0))
print(json.dumps({"y": float(y), "warnings": [str(w.message) for w in caught if "fold" in str(w.message)]}))
"""


def _child(tmp_path: Path, mode: str = "normal") -> dict:
    env = {"FOLD_CACHE_DIR": str(tmp_path / "fold"), "NUMBA_CACHE_DIR": str(tmp_path / "numba"),
           "HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin", "FOLD_BACKEND": "numba"}
    done = subprocess.run([sys.executable, "-c", CHILD, mode], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _operator_source(tmp_path: Path) -> Path:
    """The generated module that holds the operator's scalar function."""
    (found,) = [p for p in (tmp_path / "fold" / "kernels").glob("fold_gen_*.py") if "(x0_0 * x1_0)" in p.read_text()]
    return found


def _flip(path: Path) -> None:
    path.write_text(path.read_text().replace("(x0_0 * x1_0)", "(x0_0 + x1_0)"))  # '*' 0x2A -> '+' 0x2B


def _entries(tmp_path: Path, suffix: str) -> list[Path]:
    return sorted((tmp_path / "numba").rglob(f"fold_gen_*{suffix}"))


SOURCE_DAMAGE = {
    "bit flip": _flip,
    "truncated": lambda p: p.write_text(p.read_text()[: len(p.read_text()) // 2]),
    "emptied": lambda p: p.write_text(""),
    "garbage": lambda p: p.write_bytes(bytes(range(256)) * 8),
    "a directory": lambda p: (p.unlink(), p.mkdir(), (p / "x").write_text("x")),
}


@pytest.fixture
def filled(tmp_path):
    """A cache filled by one process (not copied from another test's: Numba's entries are keyed on the
    path of the source file)."""
    first = _child(tmp_path)
    assert first == {"y": 120.0, "warnings": []}, first
    return tmp_path


@pytest.mark.parametrize("damage", SOURCE_DAMAGE)
def test_a_damaged_kernel_source_is_rewritten_not_run(filled, damage):
    path = _operator_source(filled)
    SOURCE_DAMAGE[damage](path)
    second = _child(filled)
    assert second["y"] == 120.0, second
    assert len(second["warnings"]) == 1 and str(path) in second["warnings"][0], second
    assert path.is_file() and "(x0_0 * x1_0)" in path.read_text()  # repaired
    assert _child(filled) == {"y": 120.0, "warnings": []}


ENTRY_DAMAGE = {
    "compiled code, bit flip": (".nbc", lambda p: p.write_bytes(_flipped(p.read_bytes()))),
    "compiled code, truncated": (".nbc", lambda p: p.write_bytes(p.read_bytes()[:100])),
    "index, garbage": (".nbi", lambda p: p.write_bytes(b"\x80\x05garbage" * 10)),
    "index, truncated": (".nbi", lambda p: p.write_bytes(p.read_bytes()[:20])),
    "compiled code, a directory": (".nbc", lambda p: (p.unlink(), p.mkdir())),
}


def _flipped(blob: bytes) -> bytes:
    i = len(blob) // 2
    return blob[:i] + bytes([blob[i] ^ 0x01]) + blob[i + 1:]


@pytest.mark.parametrize("damage", ENTRY_DAMAGE)
def test_a_damaged_numba_cache_entry_is_compiled_again_not_loaded(filled, damage):
    suffix, hurt = ENTRY_DAMAGE[damage]
    for path in _entries(filled, suffix):
        hurt(path)
    second = _child(filled)
    assert second["y"] == 120.0, second
    assert len(second["warnings"]) == 1 and "discarded" in second["warnings"][0], second
    assert _child(filled) == {"y": 120.0, "warnings": []}  # repaired: loaded again without complaint


def test_a_read_only_cache_is_used_and_nothing_is_written_elsewhere(filled):
    third = _child(filled, "read-only")
    assert third == {"y": 120.0, "warnings": []}, third  # a filled read-only cache still serves, quietly
    assert not (filled / "home").exists()  # Numba did not fall back to ~/.cache/numba


def test_an_empty_read_only_cache_compiles_in_memory_and_writes_nowhere(tmp_path):
    (tmp_path / "fold").mkdir()
    (tmp_path / "numba").mkdir()
    out = _child(tmp_path, "read-only")
    assert out["y"] == 120.0 and len(out["warnings"]) == 1 and "in memory" in out["warnings"][0], out
    assert not (tmp_path / "home").exists()
    assert not list((tmp_path / "fold").iterdir()) and not list((tmp_path / "numba").iterdir())


# --- the operator contract --------------------------------------------------------------------------------

def _running_max(kind):
    op = lambda p, q: fold.where(p > q, p, q)  # noqa: E731 - not recognised as max: its identity is not known
    return {"reduce": lambda a: fold.reduce(op, a, identity=0.0),
            "scan": lambda a: fold.scan(op, a, identity=0.0),
            "reduce_by_index": lambda a: fold.reduce_by_index(op, 2, np.arange(5) % 2, a, identity=0.0)}[kind]


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("kind", ["reduce", "scan", "reduce_by_index"])
def test_check_mode_refuses_an_identity_that_is_not_one_on_the_data(monkeypatch, backend, kind):
    """identity=0.0 passes the check at trace time (positive sample values) but not on negative data; the
    backends disagreed (numba 0.0, numpy -1.0). Check mode names the fold, the operator, identity and x."""
    monkeypatch.setenv("FOLD_CHECK", "1")
    with pytest.raises(fold.MonoidLawError, match=rf"fold.{kind}: identity 0.0 is not an identity .*where.* "
                                                  r"gives 0.0 for x = -1.0"):
        fold.jit(_running_max(kind), backend=backend)(-np.arange(1.0, 6.0))
    assert np.all(fold.jit(_running_max(kind), backend=backend)(np.arange(1.0, 6.0)) > 0)  # right on its domain


def test_check_mode_is_off_unless_asked(monkeypatch):
    monkeypatch.setenv("FOLD_CHECK", "0")
    assert float(fold.jit(_running_max("reduce"), backend="numpy")(-np.arange(1.0, 6.0))) == -1.0


def test_check_mode_checks_folds_inside_maps(monkeypatch):
    monkeypatch.setenv("FOLD_CHECK", "1")
    f = lambda a: fold.map(_running_max("reduce"), a)  # noqa: E731
    with pytest.raises(fold.MonoidLawError, match="fold.reduce: identity 0.0"):
        fold.jit(f)(-np.arange(1.0, 7.0).reshape(2, 3))


def test_check_operator_finds_a_non_associative_operator_on_the_data():
    data = np.random.default_rng(0).standard_normal(1000)
    report = fold.check_operator(lambda p, q: p + q + p * q * q, 0.0, data)
    assert not report["associativity"].holds and report["left identity"].holds, report
    with pytest.raises(fold.MonoidLawError, match="breaks: associativity"):
        fold.check_operator(lambda p, q: p + q + p * q * q, 0.0, data, strict=True)
    assert fold.check_operator(lambda p, q: p + q, 0.0, data).ok


def test_check_operator_judges_the_identity_on_the_data_given():
    op = lambda p, q: fold.where(p > q, p, q)  # noqa: E731
    assert fold.check_operator(op, 0.0, np.linspace(0.5, 3.0, 20)).ok
    report = fold.check_operator(op, 0.0, -np.linspace(0.5, 3.0, 20))
    assert not report["left identity"].holds and float(report["left identity"].counterexample["a"]) < 0, report


# --- concurrency ------------------------------------------------------------------------------------------

def test_two_processes_compiling_into_one_cache_both_get_the_answer(tmp_path):
    env = {"FOLD_CACHE_DIR": str(tmp_path / "fold"), "NUMBA_CACHE_DIR": str(tmp_path / "numba"),
           "HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin", "FOLD_BACKEND": "numba"}
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, "normal"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
        assert json.loads(out.strip().splitlines()[-1]) == {"y": 120.0, "warnings": []}, out
    assert _child(tmp_path) == {"y": 120.0, "warnings": []}  # what they left is whole
    assert not list((tmp_path / "fold" / "kernels").glob("*.tmp"))


def test_threads_calling_one_jitted_function_agree():
    f = fold.jit(lambda a: fold.scan(lambda p, q: p + q * 1.0, a, identity=0.0), backend="numba")
    x = np.random.default_rng(1).standard_normal((8, 2000))
    want = [np.asarray(fold.jit(lambda a: fold.scan(lambda p, q: p + q * 1.0, a, identity=0.0),
                                backend="numpy")(row)) for row in x]
    got: dict[int, np.ndarray] = {}

    def call(i: int) -> None:
        got[i] = np.asarray(f(x[i]))

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(x))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(len(x)):
        np.testing.assert_allclose(got[i], want[i], rtol=1e-12, atol=1e-12)


# --- huge allocations -------------------------------------------------------------------------------------

@pytest.mark.parametrize("make", [lambda x: fold.replicate(10**12, x), lambda x: fold.iota(10**12) * 0.0 + x],
                         ids=["replicate", "iota"])
def test_an_allocation_too_large_is_a_fold_error_naming_the_size(make):
    with pytest.raises(fold.FoldRuntimeError, match=r"1000000000000"):
        fold.run(make, np.float64(1.0))


# --- non-finite inputs at the monoids' edges --------------------------------------------------------------

@pytest.mark.parametrize("rule", ["auto", "generic", "monoid"])
def test_logaddexp_gradient_at_plus_inf_is_the_inf_elements(rule):
    """d/dx_i logaddexp(x) = exp(x_i - total): [0, 1] for [1, inf] (it was [0, nan] by the monoid's D)."""
    g = fold.grad(lambda x: fold.reduce(fold.monoids.logaddexp, x), reduce_rule=rule)(np.array([1.0, np.inf]))
    np.testing.assert_array_equal(g, [0.0, 1.0])


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("monoid, data, want", [
    ("logaddexp", [-np.inf, -np.inf], -np.inf), ("logaddexp", [np.inf, 1.0], np.inf),
    ("max", [-np.inf, np.nan, 1.0], np.nan), ("min", [np.inf, np.inf], np.inf), ("sum", [np.inf, -np.inf], np.nan),
    ("prod", [0.0, np.inf], np.nan)])
def test_monoids_at_their_edges_agree_with_numpy(backend, monoid, data, want):
    got = float(fold.jit(lambda x: fold.reduce(getattr(fold.monoids, monoid), x), backend=backend)(np.array(data)))
    assert got == want or (np.isnan(want) and np.isnan(got)), (monoid, data, got)


# --- the gemm gradient of a monoid without d ----------------------------------------------------------------

_VSUM_WITHOUT_D = fold.Monoid(lambda x, y: {"v": x["v"] + y["v"]}, {"v": 0.0}, commutative=True, name="vsum without d")


def _gemm_vector_fold(monoid):
    """A gemm_map_reduce with a vector payload (D = 8 entries per pair): the generic rule's intermediates
    are pairs x D."""
    def f(q, k, v):
        out = fold.gemm_map_reduce(monoid, lambda s, vj: {"v": fold.tanh(s) * vj * vj}, q, k, cols=(v,), block=(8, 16))
        return fold.sum(out["v"])

    return f


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_gemm_gradient_of_a_monoid_without_d_holds_no_m_by_n_by_d_array(backend):
    """The generic rule ran over all M rows at once and held several M x N x D arrays (26.8 GiB at
    M = N = 30000, D = 4); now it walks row blocks, and its peak stays below one M x N x D float64 array
    (it was 4.25 of them) while its gradient equals vsum's (the monoid rule)."""
    import gc
    import tracemalloc
    import warnings

    m, n, d = 512, 64, 8
    rng = np.random.default_rng(3)
    args = rng.standard_normal((m, 3)), rng.standard_normal((n, 3)), rng.standard_normal((n, d))
    with fold.use_backend(backend), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the one warning that the generic rule runs
        grad = fold.grad(_gemm_vector_fold(_VSUM_WITHOUT_D), argnums=(0, 1, 2))
        grad(*args)  # trace and compile outside the measurement
        gc.collect()
        tracemalloc.start()
        try:
            got = grad(*args)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        want = fold.grad(_gemm_vector_fold(fold.monoids.vsum), argnums=(0, 1, 2))(*args)
    full = m * n * d * 8
    assert peak < full, f"peak {peak} bytes >= M x N x D float64 = {full}"
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-10)
