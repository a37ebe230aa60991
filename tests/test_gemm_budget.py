"""gemm_map_reduce's memory budget: what one block's intermediates and a gradient's kept products may take.

The block size and the products a gradient keeps follow a budget in bytes (`budget=`, FOLD_GEMM_BUDGET; with
FOLD_GEMM_BUDGET=auto 1/16 of the products never materialised, between 16 MiB and 1.125 GiB; by default
1.125 GiB, blocks sized for speed). Checked here: under `auto`, the paper's
MLP gradient (B = K = 8192 and 16384, D = 128, float32) as the numba backend prepares it holds at most 5% of
what the naive formula holds (traced only: nothing of that size is computed); a small MLP gradient's peak
resident memory, measured in a subprocess, stays within a budget set by FOLD_GEMM_BUDGET; the results do not
depend on the budget; the variable's errors.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import fold
from fold import gemm as fold_gemm
from fold.ad import vjp_program
from fold.inline import inline_program
from fold.primitives import GemmMapReduce
from fold.runtime.memory import program_peak
from fold.runtime.numba_backend.gemm_backward_fusion import GemmWithBackward
from fold.runtime.numba_backend.passes import prepare

ROOT = Path(__file__).resolve().parent.parent


def mlp(X, P, Q, **kw):
    """examples/gemm_layers.py's MLP, sigmoid(X P) Q, with gemm_map_reduce's keyword arguments."""
    return fold.gemm_map_reduce(fold.monoids.vsum, lambda s, q: {"v": fold.sigmoid(s) * q}, X, P.T, cols=(Q,), **kw)["v"]


def _zeros(*shape: int, dtype=np.float32) -> np.ndarray:
    return np.broadcast_to(np.zeros((), dtype), shape)  # traced only: no memory of that size


@pytest.mark.parametrize("size", [8192, 16384])
def test_paper_mlp_gradient_holds_at_most_5_percent_of_the_naive_formula(size: int, monkeypatch) -> None:
    """The MLP gradient (the forward and backward walked together, as the numba backend runs it) holds at
    most 5% of the naive formula's memory: its estimated peak (outputs, one block program's intermediates,
    the kept products of a row block; inputs not counted) against the three B x K float32 matrices the
    naive formula holds at once (h, G Q^T and dh: examples/gemm_layers.mlp_naive; bench_gemm measured its
    peak at exactly that, 768 MiB at 8192). The old default (blocks of 128 MiB of intermediates, 1 GiB of
    kept products, still the default) holds 160 MiB at 8192, 21%, and 232 MiB at 16384."""
    monkeypatch.setenv(fold_gemm.BUDGET_VARIABLE, "auto")
    B = K = size
    D = 128
    X, P, Q = _zeros(B, D), _zeros(D, K), _zeros(K, D)
    grad, _ = vjp_program(fold.trace(mlp, X, P, Q), with_primal_outputs=True)
    (gemm,) = [s.prim for s in grad.stmts if isinstance(s.prim, GemmMapReduce)]
    budget = fold_gemm.default_budget(B, K, 1, 4)
    assert budget == B * K * 4 // 16, budget
    bi, bj = gemm.block
    assert bi * bj * 4 * 6 <= budget and gemm.keep <= budget - bi * bj * 4, (gemm.block, gemm.keep, budget)
    prepared = prepare(grad, whole_arrays=True)
    fused = [s.prim for s in prepared.stmts if isinstance(s.prim, GemmWithBackward)]
    assert len(fused) == 1, [s.prim.name for s in prepared.stmts]  # one walk, keeping products within the budget
    naive = 3 * B * K * 4
    peak = program_peak(prepared, count_inputs=False)
    assert peak <= 0.05 * naive, f"{peak / 2**20:.1f} MiB > 5% of {naive / 2**20:.0f} MiB"


def test_budget_bounds_the_blocks_and_the_kept_products() -> None:
    """A smaller budget gives smaller blocks and fewer kept bytes; `keep` and `block` still apply within it."""
    X, P, Q = _zeros(4096, 64), _zeros(64, 4096), _zeros(4096, 64)

    def gemm(**kw) -> GemmMapReduce:
        (stmt,) = [s for s in fold.trace(lambda *a: mlp(*a, **kw), X, P, Q).stmts if isinstance(s.prim, GemmMapReduce)]
        return stmt.prim

    small, large = gemm(budget=2**22), gemm(budget=2**28)
    assert small.block[0] * small.block[1] < large.block[0] * large.block[1]
    assert 0 < small.keep <= 2**22 - small.block[0] * small.block[1] * 4 and large.keep > small.keep
    assert gemm(budget=2**28, keep=1000).keep == 1000
    assert gemm(budget=2**20, block=(1024, 1024)).keep == 0  # the block alone takes more than the budget


def test_a_backends_block_cap_gives_larger_blocks_and_its_own_trace() -> None:
    """The cuda backend asks for blocks of up to 512 MiB (each block's statements launch from Python): a
    program traced for it (runtime.api._traced_for) has larger automatic blocks than one traced for the CPU
    backends, the same function traced under each cap is two programs, and a cap of None is MAX_BLOCK_BYTES."""
    from fold.api import signature_of
    from fold.runtime.api import _traced_for
    from fold.runtime.backends import get_backend

    X, P, Q = _zeros(16384, 64), _zeros(64, 16384), _zeros(16384, 64)

    def layer(x, p, q):
        return mlp(x, p, q)

    def block(program) -> tuple:
        (stmt,) = [s for s in program.stmts if isinstance(s.prim, GemmMapReduce)]
        return stmt.prim.block

    _, signature = signature_of((X, P, Q), "test")
    on_cpu = _traced_for(get_backend("numpy"), layer, signature)
    for_gpu = type("GpuLike", (), {"gemm_block_bytes": 512 * 2**20})()
    on_gpu = _traced_for(for_gpu, layer, signature)
    assert on_gpu is not on_cpu and block(on_gpu)[0] * block(on_gpu)[1] > 3 * block(on_cpu)[0] * block(on_cpu)[1]
    assert _traced_for(for_gpu, layer, signature) is on_gpu  # traced once per cap
    with fold_gemm.blocks_of_at_most(None):
        assert fold_gemm.block_cap() == fold_gemm.MAX_BLOCK_BYTES
        with fold_gemm.blocks_of_at_most(2**20):
            assert fold_gemm.block_cap() == 2**20
        assert fold_gemm.block_cap() == fold_gemm.MAX_BLOCK_BYTES
    from numba import cuda

    if cuda.is_available():
        from fold.runtime.cuda_backend.backend import CudaBackend

        assert CudaBackend.gemm_block_bytes > fold_gemm.MAX_BLOCK_BYTES


def test_environment_variable_sets_the_default_budget(monkeypatch) -> None:
    monkeypatch.setenv(fold_gemm.BUDGET_VARIABLE, "3M")
    assert fold_gemm.default_budget(10**5, 10**5, 1, 4) == 3 * 2**20
    monkeypatch.setenv(fold_gemm.BUDGET_VARIABLE, "5000")
    assert fold_gemm.default_budget(10, 10, 1, 8) == 5000
    monkeypatch.setenv(fold_gemm.BUDGET_VARIABLE, "auto")
    assert fold_gemm.default_budget(10, 10, 1, 8) == fold_gemm.MIN_BUDGET
    assert fold_gemm.default_budget(2**20, 2**20, 2, 4) == fold_gemm.MAX_BUDGET
    assert fold_gemm.default_budget(2**14, 2**14, 2, 4) == 2**14 * 2**14 * 8 // 16
    monkeypatch.delenv(fold_gemm.BUDGET_VARIABLE)
    assert fold_gemm.default_budget(10, 10, 1, 8) == fold_gemm.MAX_BUDGET
    assert fold_gemm.default_budget(2**14, 2**14, 2, 4) == fold_gemm.MAX_BUDGET


@pytest.mark.parametrize("value", ["lots", "-3M", "0", "1.5G", "M"])
def test_a_bad_budget_variable_is_a_clear_error(value: str, monkeypatch) -> None:
    monkeypatch.setenv(fold_gemm.BUDGET_VARIABLE, value)
    with pytest.raises(ValueError, match=f"FOLD_GEMM_BUDGET must be a positive number of bytes.*got {value!r}"):
        fold.trace(mlp, _zeros(8, 4), _zeros(4, 8), _zeros(8, 4))


def test_results_do_not_depend_on_the_budget() -> None:
    """The MLP and its gradient (float64) under a small budget (many blocks, products partly kept) equal
    one unblocked block on the numpy backend and the naive formula with its hand-written backward."""
    from examples.gemm_layers import mlp_naive

    rng = np.random.default_rng(39)
    B, K, D = 300, 500, 7
    X, P, Q, G = rng.normal(size=(B, D)), rng.normal(size=(D, K)), rng.normal(size=(K, D)), rng.normal(size=(B, D))

    def value_and_grads(backend: str, **kw) -> list:
        grad, _ = vjp_program(fold.trace(lambda *a: mlp(*a, **kw), X, P, Q), with_primal_outputs=True)
        return list(fold.jit(lambda *a: inline_program(grad, list(a)), backend=backend)(X, P, Q, G))

    small = fold.trace(lambda *a: mlp(*a, budget=2**17), X, P, Q)
    (stmt,) = [s for s in small.stmts if isinstance(s.prim, GemmMapReduce)]
    assert stmt.prim.block[0] < B and stmt.prim.block[1] < K and 0 < stmt.prim.keep, (stmt.prim.block, stmt.prim.keep)
    got = value_and_grads("numba", budget=2**17)
    unblocked = value_and_grads("numpy", block=(B, K))
    naive_y = (1.0 / (1.0 + np.exp(-(X @ P)))) @ Q
    naive = [naive_y] + list(mlp_naive(X, P, Q, G)[1])
    for a, b, c in zip(got, unblocked, naive, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(a, c, rtol=1e-10, atol=1e-10)


_PEAK_SCRIPT = textwrap.dedent("""
    import gc, json, sys
    import numpy as np
    import fold
    from benchmarks.common import reset_peak_rss, status_bytes
    from fold.ad import vjp_program
    from fold.inline import inline_program
    from tests.test_gemm_budget import mlp

    B = K = 2048
    D = 16
    rng = np.random.default_rng(0)
    X, P, Q, G = (rng.standard_normal(s, dtype=np.float32) for s in [(B, D), (D, K), (K, D), (B, D)])
    grad, _ = vjp_program(fold.trace(mlp, X, P, Q), with_primal_outputs=True)
    run = fold.jit(lambda *a: inline_program(grad, list(a)), backend="numba")
    out = run(X, P, Q, G)  # compiles; its freed memory goes back to the system (MALLOC_MMAP_THRESHOLD_)
    del out
    gc.collect()
    base = status_bytes("VmRSS")
    reset = reset_peak_rss()
    out = run(X, P, Q, G)
    peak = status_bytes("VmHWM") - base
    block = [s.prim.block for s in grad.stmts if s.prim.name == "gemm_map_reduce"][0]
    print(json.dumps({"peak": peak, "reset": reset, "outputs": sum(a.nbytes for a in out), "block": list(block)}))
""")


def _measured_peak(budget: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != fold_gemm.BUDGET_VARIABLE}
    env.update({"FOLD_BACKEND": "numba", "FOLD_KEEP_FREED_MEMORY": "0", "MALLOC_MMAP_THRESHOLD_": "65536",
                "MALLOC_TRIM_THRESHOLD_": "0", "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])})
    if budget is not None:
        env[fold_gemm.BUDGET_VARIABLE] = budget
    proc = subprocess.run([sys.executable, "-c", _PEAK_SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads VmHWM from /proc/self/status")
def test_measured_gradient_peak_stays_within_the_budget() -> None:
    """The MLP gradient (B = K = 2048, D = 16, float32: 16 MiB per B x K matrix) run on numba in a fresh
    process: with FOLD_GEMM_BUDGET=2M its peak resident memory above the baseline is at most its outputs,
    the 2 MiB budget and 2 MiB more (the float64 row sums, the transposed operand, allocator slack); one
    B x K matrix alone would exceed that. Under the default budget (1.125 GiB) it is larger."""
    small = _measured_peak("2M")
    if not small["reset"]:
        pytest.skip("VmHWM cannot be reset here")
    assert small["block"][0] < 2048, small
    limit = small["outputs"] + 4 * 2**20
    assert small["peak"] <= limit, f"{small['peak'] / 2**20:.1f} MiB > {limit / 2**20:.1f} MiB ({small})"
    assert limit < 2048 * 2048 * 4
    default = _measured_peak(None)
    assert default["peak"] > small["peak"], (default, small)
