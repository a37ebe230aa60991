"""The CUDA kernels compile for a real GPU, not only on the simulator: every kernels.cuda template, with
operators and map bodies that the cuda backend compiles from traced programs (records, 2 x 2 and 8 x 8
matrices, float32, integer and boolean leaves, the NaN-aware helpers) and the loop nests' kernels, compiled to PTX for compute
capability 9.0 by NVVM and assembled by ptxas, which checks each kernel's shared memory and registers.
Needs the CUDA toolkit, not a GPU: without NVVM the test is skipped, saying so; without ptxas it fails."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NO_TOOLKIT = 77

SCRIPT = textwrap.dedent('''
    import shutil, subprocess, sys, tempfile
    import numba, numpy as np
    from numba import cuda, types

    try:
        cuda.compile_ptx(lambda x: x + 1.0, (types.float64,), device=True, cc=(9, 0))
    except Exception as err:
        print(f"no CUDA toolkit: {type(err).__name__}: {err}")
        sys.exit(77)

    # A device function called by a kernel is compiled for the current device's compute capability, which
    # needs a driver; with no GPU here, it is told the capability the kernels are compiled for.
    import numba.cuda.dispatcher

    class Hopper:
        compute_capability = (9, 0)

    numba.cuda.dispatcher.get_current_device = lambda: Hopper()

    import fold
    from fold.primitives import Map, Reduce
    from fold.kernels.cuda import host
    from fold.kernels.cuda.fold import _block_totals_source, _strided_source, _tiled_source
    from fold.kernels.cuda.histogram import _ATOMIC_ADD_SOURCE, _FILL_SOURCE, _merge_source, _private_source
    from fold.kernels.cuda.map import _map_source
    from fold.kernels.cuda.scan import _block_scan_source
    from fold.kernels.cuda.segmented import _segmented_scan_source, _segmented_source
    from fold.runtime.cuda_backend.device_functions import device_function
    from fold.runtime.numba_backend.captured_operands import carrying

    def body(f, *args, kind=Reduce):
        program = fold.trace(f, *args)
        prim = next(s for s in program.stmts if isinstance(s.prim, kind)).prim
        prim = carrying(prim) if kind is Reduce and prim.num_consts else prim  # captured values as element fields
        fn, problem = device_function(prim.body)
        assert fn is not None, problem
        return fn, prim

    def affine(a, b):
        return a[0] * b[0], b[0] * a[1] + b[1]

    def first_max(a, b):
        return fold.where(b[0] > a[0], b[0], a[0]), fold.where(b[0] > a[0], b[1], a[1])

    x, x32, i64 = np.ones(4), np.ones(4, np.float32), np.arange(4)
    operators = {
        "affine": (body(lambda x: fold.reduce(affine, (x, x), identity=(1.0, 0.0)), x), [np.float64] * 2),
        "2x2": (body(lambda m: fold.reduce(lambda a, b: a @ b, m, identity=np.eye(2)), np.ones((4, 2, 2))), [np.float64] * 4),
        "8x8": (body(lambda m: fold.reduce(lambda a, b: a @ b, m, identity=np.eye(8)), np.ones((4, 8, 8))), [np.float64] * 64),
        "logaddexp": (body(lambda x: fold.reduce(fold.monoids.logaddexp, x), x), [np.float64]),
        "float32 first max": (body(lambda v, i: fold.reduce(first_max, (v, i), identity=(-np.inf, -1)), x32, i64),
                              [np.float32, np.int64]),
        "int32 max": (body(lambda v: fold.reduce(fold.monoids.max, v), np.ones(4, np.int32)), [np.int32]),
        "captured t": (body(lambda x, t: fold.reduce(lambda a, b: a + b + t * a * b, x, identity=0.0), x, 0.7),
                       [np.float64] * 2),
        "bool or": (body(lambda b: fold.reduce(lambda p, q: p | q, b, identity=False), np.ones(4, bool)), [np.bool_]),
    }
    def remainders(i, f):
        return fold.map(lambda a, b: (a % 7 + a // -3, b % -2.5 + b // 0.75), i, f)

    mappers = {
        "helpers": (body(lambda x, c: fold.map(lambda v: (fold.sigmoid(v) * c + np.tanh(v), np.sqrt(v) > np.log(v)), x),
                         x, 2.0, kind=Map), [np.float64], 1, [np.float64, np.bool_]),
        "int64 and float64 % and //": (body(remainders, i64, x, kind=Map), [np.int64, np.float64], 0,
                                       [np.int64, np.float64]),
        "int32 and float32 % and //": (body(remainders, np.arange(4, dtype=np.int32), x32, kind=Map),
                                       [np.int32, np.float32], 0, [np.int32, np.float32]),
    }

    def array(dtype, ndim):
        return types.Array(numba.from_dtype(np.dtype(dtype)), ndim, "C")

    def scalar(dtype):
        return numba.from_dtype(np.dtype(dtype))

    kernels = []
    for name, ((combine, _), dtypes) in operators.items():
        shape = host.launch(None, None, dtypes)
        leaves, idents = [array(d, 1) for d in dtypes], [scalar(d) for d in dtypes]
        rows = [array(d, 2) for d in dtypes]
        for reverse in (False, True):
            kernels.append((f"{name} block totals reverse={reverse}", _block_totals_source(tuple(dtypes), shape, reverse, reverse),
                            combine, (*leaves, *idents, types.int64, *leaves)))
            kernels.append((f"{name} block scan exclusive={reverse} reverse={reverse}",
                            _block_scan_source(tuple(dtypes), shape, reverse, reverse, reverse),
                            combine, (*leaves, *idents, types.int64, *leaves, *leaves)))
            kernels.append((f"{name} segmented scan reverse={reverse}",
                            _segmented_scan_source(tuple(dtypes), shape.threads, reverse, reverse),
                            combine, (*rows, *idents, types.int64, *rows)))
        for label, grid_source in (("tiled", _tiled_source), ("grid-stride", _strided_source)):
            kernels.append((f"{name} {label} reduce", grid_source(tuple(dtypes), shape), combine,
                            (*leaves, *idents, types.int64, types.int64, *leaves)))
        kernels.append((f"{name} segmented reduce", _segmented_source(tuple(dtypes), shape.threads),
                        combine, (*rows, *idents, types.int64, *leaves)))
        kernels.append((f"{name} private histograms", _private_source(len(dtypes)), combine,
                        (array(np.int64, 1), *leaves, *idents, types.int64, types.int64, *rows)))
        kernels.append((f"{name} merge of private histograms", _merge_source(len(dtypes)), combine, (*rows, *leaves)))
    for dtype in (np.float64, np.float32, np.int64, np.int32):
        kernels.append((f"{np.dtype(dtype)} atomic add", _ATOMIC_ADD_SOURCE, None,
                        (array(np.int64, 1), array(dtype, 1), types.int64, array(dtype, 1))))
        kernels.append((f"{np.dtype(dtype)} fill", _FILL_SOURCE, None, (array(dtype, 1), scalar(dtype))))
    for name, ((mapper, _), inputs, consts, outs) in mappers.items():
        kernels.append((f"{name} map", _map_source(len(inputs), consts, len(outs)), mapper,
                        (*[array(d, 1) for d in inputs], *[types.float64] * consts, types.int64, *[array(d, 1) for d in outs])))

    # a fused elementwise run (runtime/cuda_backend/fused.py) over 2 and 3 dimensions, its broadcast operands
    # strided ("A": stride 0 along the broadcast axes), float32 and a boolean result
    from fold.kernels.cuda.map import _map_over_source
    from fold.runtime.cuda_backend.fused import prepared
    from fold.runtime.numba_backend.elementwise_fusion import FusedElementwise

    def guarded_exp(s, m):
        return fold.where(m == -np.inf, 0.0, fold.exp(s - m)) * 0.5, s > m

    for ndim in (2, 3):
        s32, m32 = np.ones((3,) * ndim, np.float32), np.ones((3,) + (1,) * (ndim - 1), np.float32)
        run = next(t.prim for t in prepared(fold.trace(guarded_exp, s32, m32)).stmts if isinstance(t.prim, FusedElementwise))
        fused, problem = device_function(run.body)
        assert fused is not None, problem
        strided = types.Array(numba.from_dtype(np.dtype(np.float32)), ndim, "A")
        outs = [array(v.aval.dtype, ndim) for v in run.region.outputs]
        for by_rows in (False, True):  # its elements unravelled, or by rows on a 2-D grid
            kernels.append((f"fused elementwise run, {ndim} dimensions{', by rows' * by_rows}",
                            _map_over_source(len(run.region.inputs), ndim, len(outs), by_rows), fused,
                            (*[strided] * len(run.region.inputs), types.int64, *[types.int64] * (ndim - 1), *outs)))

    # loop nests (runtime/cuda_backend/loop_nests.py): a fold with its one-thread merge, a fold of a (k, d)
    # row state (local arrays), a parallel map; float32, the helpers they call compiled beside them
    import math
    from fold.runtime.cuda_backend import device_helpers
    from fold.runtime.cuda_backend.loop_nests import fold_source, map_source, merge_source
    from fold.runtime.loops import LoopNest, fuse_loop_nests, kernel_of
    from fold.runtime.loops.nest import ParallelMap

    M = fold.monoids

    def kmeans(C, P):
        return fold.reduce(M.sum, fold.map(lambda p: fold.reduce(M.min, fold.map(
            lambda c: fold.reduce(M.sum, (p - c) * (p - c)), C)), P))

    def softmin_rows(C, P):
        return fold.map(lambda p: fold.reduce(M.logaddexp, fold.map(lambda c: -fold.reduce(M.sum, (p - c) * (p - c)), C)), P)

    def horner(c, x):  # a fold.loop over vectors: a map of a loop over scalars (runtime/loops/loop_maps.py)
        return fold.loop(lambda i, acc: acc * x + c[i], x * 0.0, c.shape[0])

    helpers = {"math": math, **{name: getattr(device_helpers, name) for name in device_helpers.HELPERS}}
    C32, P32 = np.ones((4, 3), np.float32), np.ones((9, 3), np.float32)
    for label, f, args in (("k-means", kmeans, (C32, P32)), ("k-means gradient", fold.grad(kmeans, argnums=0), (C32, P32)),
                           ("softmin rows", softmin_rows, (C32, P32)), ("horner loop", horner, (x32, np.ones(9, np.float32)))):
        for stmt in fuse_loop_nests(fold.trace(f, *args)).stmts:
            if not isinstance(stmt.prim, LoopNest):
                continue
            nest = kernel_of(stmt.prim)
            ins = [array(p.dtype, max(1, len(p.shape))) for p in nest.inputs]
            if isinstance(nest.outer, ParallelMap):
                outs = [array(p.dtype, max(1, len(p.shape))) for p in nest.outputs]
                kernels.append((f"{label} nest (parallel map)", map_source(nest), helpers, (*ins, *outs)))
                continue
            parts = [array(s.dtype, 1 + len(s.shape or (1,)) if s.stored else 1) for s in nest.outer.states]
            kernels.append((f"{label} nest (parallel fold)", fold_source(nest), helpers, (*ins, *parts, types.int64)))
            kernels.append((f"{label} nest (merge)", merge_source(nest), helpers,
                            (*parts, *[array(p.dtype, 1) for p in nest.outputs], types.int64)))

    ptxas = shutil.which("ptxas") or shutil.which("ptxas", path="/usr/local/cuda/bin")
    failed = [] if ptxas else ["ptxas not found (on PATH or in /usr/local/cuda/bin): nothing was assembled"]
    for name, source, fn, signature in kernels:
        namespace = {"cuda": cuda, "np": np, **(fn if isinstance(fn, dict) else {"combine": fn, "mapper": fn})}
        exec(source, namespace)
        try:
            ptx, _ = cuda.compile_ptx(namespace["kernel"], signature, cc=(9, 0))
        except Exception as err:
            failed.append(f"{name}: NVVM: {type(err).__name__}: {str(err)[:300]}")
            continue
        if ptxas:
            with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
                f.write(ptx)
                f.flush()
                done = subprocess.run([ptxas, "-arch=sm_90", f.name, "-o", "/dev/null"], capture_output=True, text=True)
            if done.returncode:
                failed.append(f"{name}: ptxas: {done.stderr.strip()[:300]}")
    print(f"{len(kernels)} kernels compiled to PTX, {'assembled by ' + ptxas if ptxas else 'ptxas not found'}")
    print("\\n".join(failed))
    sys.exit(1 if failed else 0)
''')


def test_every_kernel_template_compiles_for_a_real_gpu():
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    if done.returncode == NO_TOOLKIT:
        pytest.skip(done.stdout.strip())
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    print(done.stdout)
