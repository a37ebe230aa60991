"""OpenBLAS's idle threads go to sleep at once, so that they do not take the cores from the backend's kernels.

The numba backend alternates BLAS products with its own parallel kernels (gemm_map_reduce's block walk,
k-means' distances then their minimum). After each product OpenBLAS's worker threads spin, waiting for the
next one, for 2^28 cycles by default (about 0.1 s): long enough that on every block they compete with the
Numba threads that run next, and the kernel after a product took up to twice its time (measured on 2
cores: attention 4096 x 4096 forward 238 -> 163 ms, k-means forward 200 -> 151 ms with the shorter wait).

OpenBLAS reads its wait (OPENBLAS_THREAD_TIMEOUT, as a power of two cycles) when it starts its threads. The
backend therefore sets it, when it is first used, to 2^14 cycles (a few microseconds: back-to-back products
still find their threads awake), and restarts the threads of every OpenBLAS already loaded in the process
(NumPy's and SciPy's each bundle one) so that they read it. The variable stays set, so an OpenBLAS loaded
later, and child processes, wait as briefly. A value the user has set is left as it is; FOLD_QUIET_BLAS=0
leaves OpenBLAS alone. The restart must not overlap a product running in another thread: it happens once,
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
    if os.environ.get("FOLD_QUIET_BLAS", "1") == "0" or "OPENBLAS_THREAD_TIMEOUT" in os.environ:
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
