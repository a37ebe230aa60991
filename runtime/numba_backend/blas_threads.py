"""OpenBLAS's idle threads go to sleep at once, so that they do not take the cores from the backend's kernels.

The numba backend alternates BLAS products with its own parallel kernels (gemm_map_reduce's block walk,
k-means' distances then their minimum). After each product OpenBLAS's worker threads spin, waiting for the
next one, for 2^28 cycles by default (about 0.1 s): long enough that on every block they compete with the
Numba threads that run next, and the kernel after a product took up to twice its time (measured on 2
cores: attention 4096 x 4096 forward 238 -> 163 ms, k-means forward 200 -> 151 ms with the shorter wait).

Opt-in (FOLD_QUIET_BLAS=1), because it acts on the whole process and costs far more than it gains once the
machine has other work: with another busy process on the 2 cores, products with a long inner dimension and
a small result took 0.3-0.7 s instead of 1-10 ms (the GMM gradient 366 ms vs 44 ms, the k-means gemm HVP
3.9 s vs 0.14 s; benchmarks/bench_load.py measures it): threads that sleep at once are woken for every
product, and the wake-up waits for a core. A library must not change that for its host process.

OpenBLAS reads its wait (OPENBLAS_THREAD_TIMEOUT, as a power of two cycles) when it starts its threads. With
FOLD_QUIET_BLAS=1 the backend sets it, when it is first used, to 2^14 cycles (a few microseconds: back-to-back products
still find their threads awake), and restarts the threads of every OpenBLAS already loaded in the process
(NumPy's and SciPy's each bundle one) so that they read it. The variable stays set, so an OpenBLAS loaded
later, and child processes, wait as briefly. A value the user has set is left as it is; by default (or
FOLD_QUIET_BLAS=0) OpenBLAS is left alone. The restart must not overlap a product running in another thread: it happens once,
when the backend compiles its first program. Only OpenBLAS, and only where the process can list its
libraries (Linux's /proc/self/maps), is touched; elsewhere nothing changes.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

TIMEOUT_EXPONENT = 14  # OpenBLAS clamps it to [4, 30]
_MAPS = Path("/proc/self/maps")

_applied: bool | None = None


def quiet_blas_threads() -> bool:
    """Apply the shorter wait once per process; whether it is in effect for the OpenBLAS libraries loaded."""
    global _applied
    if _applied is None:
        _applied = _apply()
    return _applied


def loaded_openblas() -> list[str]:
    """The paths of the OpenBLAS libraries mapped into this process (empty where that cannot be listed)."""
    try:
        lines = _MAPS.read_text().splitlines()
    except OSError:
        return []
    return sorted({line.split()[-1] for line in lines if "openblas" in line.rsplit("/", 1)[-1].lower()})


def _apply() -> bool:
    if os.environ.get("FOLD_QUIET_BLAS", "0") != "1" or "OPENBLAS_THREAD_TIMEOUT" in os.environ:
        return False
    os.environ["OPENBLAS_THREAD_TIMEOUT"] = str(TIMEOUT_EXPONENT)  # for an OpenBLAS loaded later
    restarted = False
    for path in loaded_openblas():
        try:
            lib = ctypes.CDLL(path)
            read_env, shutdown = lib.openblas_read_env, lib.blas_thread_shutdown_
        except (OSError, AttributeError):
            continue  # not a build with these entry points: it keeps its own wait
        read_env.restype = None
        read_env()
        shutdown()  # its threads start again, with the new wait, on the next product
        restarted = True
    return restarted
