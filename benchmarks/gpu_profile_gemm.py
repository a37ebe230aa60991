"""Where the cuda backend's gemm_map_reduce spends its time, on a GPU (not run in CI): attention at 16384,
float32, with blocks of 128 MiB (the CPU backends' cap), 512 MiB (the cuda backend's) and 2 GiB (time and
working bytes of the forward and of forward+backward), then one warm forward with a device synchronisation after each block statement, its time
summed per (primitive, op, depth). `python -m benchmarks.gpu_profile_gemm` writes $OUT/profile_gemm.json.

Each block size traces a new function: fold.jit reuses a traced program for the same function, so changing
the budget alone would run the old blocks."""
import collections
import json
import os
import time

import numpy as np

import fold
import fold.gemm as G
from fold.runtime import interpreter
from fold.runtime.cuda_backend import device
from fold.runtime.cuda_backend.backend import CudaBackend
from benchmarks.bench_cuda import _sync, gpu_seconds, working_bytes
from examples.gemm_layers import attention as attention_layer


def main() -> dict:
    out = {}
    rng = np.random.default_rng(2)
    M = 16384
    Q, K, V, Gc = (rng.normal(size=(M, 64)).astype(np.float32) for _ in range(4))
    dQ, dK, dV, dG = (device.to_device(a) for a in (Q, K, V, Gc))
    default_cap = CudaBackend.gemm_block_bytes
    for cap in (128 * 2**20, 512 * 2**20, 2048 * 2**20):
        CudaBackend.gemm_block_bytes = cap
        os.environ["FOLD_GEMM_BUDGET"] = str(2 * cap + 2**30)
        attention = lambda q, k, v: attention_layer(q, k, v)   # a new function: traced afresh under this cap
        grad = lambda q, k, v, g: fold.vjp(attention, q, k, v)[1](g)
        for mode, f, args in (("fwd", attention, (dQ, dK, dV)), ("fwd_bwd", grad, (dQ, dK, dV, dG))):
            run = fold.jit(f, backend="cuda", results="device")
            t = gpu_seconds(lambda: run(*args), 3)
            w = working_bytes(lambda: run(*args))
            with G.blocks_of_at_most(cap):
                traced = fold.trace(f, Q, K, V, *([Gc] if mode == "fwd_bwd" else []))
            block = [s.prim.block for s in traced.stmts if hasattr(s.prim, "block")]
            out[f"{mode}_cap{cap >> 20}M"] = {"seconds": t, "working_bytes": w, "blocks": block}
            print(mode, cap >> 20, t, w, block, flush=True)
    CudaBackend.gemm_block_bytes = default_cap
    os.environ.pop("FOLD_GEMM_BUDGET")
    times = collections.Counter(); counts = collections.Counter()
    orig = interpreter._run_step
    nest = [0]

    def timed(step, values, depth):
        nest[0] += 1
        try:
            if nest[0] != 2:
                return orig(step, values, depth)
            _sync(); t = time.perf_counter()
            r = orig(step, values, depth)
            _sync()
            key = f"{step.prim.name}:{getattr(step.prim, 'op', '')}:d{depth}"
            times[key] += time.perf_counter() - t; counts[key] += 1
            return r
        finally:
            nest[0] -= 1

    interpreter._run_step = timed
    attention = lambda q, k, v: attention_layer(q, k, v)
    run = fold.jit(attention, backend="cuda", results="device")
    run(dQ, dK, dV); _sync()
    times.clear(); counts.clear()
    t0 = time.perf_counter(); run(dQ, dK, dV); _sync(); total = time.perf_counter() - t0
    rows = [(k, round(v * 1e3, 3), counts[k]) for k, v in times.most_common(30)]
    out["breakdown_fwd_ms"] = {"total_ms": total * 1e3, "rows": rows}
    print(total, json.dumps(rows), flush=True)
    json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "profile_gemm.json"), "w"), indent=1)
    return out


if __name__ == "__main__":
    main()
