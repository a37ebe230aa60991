"""Freed memory stays in the process, so that the next large array reuses its pages.

A fold program allocates a new array for most statements and frees it after its last use. glibc's malloc
serves every allocation over 32 MiB with a fresh mmap and returns it to the system on free, so each such
array is faulted in page by page again, at the cost of writing it once more: at 10^7 float64 elements a
fifth to a third of the generic scan gradient's time went to page faults. With FOLD_KEEP_FREED_MEMORY=1 the
numba backend asks malloc, when it is first used, to take every allocation from its heap and to keep freed memory there
(M_MMAP_MAX = 0, M_TRIM_THRESHOLD = 2 GiB). The cost: freed memory stays with the process (all of it
inside the heap, up to 2 GiB at its top), as with JAX's and PyTorch's caching allocators; a threshold of
"never" kept so much that a long benchmark process ran short of memory. It is opt-in: malloc's settings
belong to the whole process (every library in it, and memory that fold never allocated), they cannot be
read back to be restored after a call, and a process that frees large arrays to make room for something
else would keep up to 2 GiB it did not ask for. By default (or FOLD_KEEP_FREED_MEMORY=0) malloc is left as
it is; on a system without glibc's mallopt nothing changes.
"""

from __future__ import annotations

import ctypes
import os

_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_TRIM_THRESHOLD = 2**31 - 1  # the largest value the int parameter takes: 2 GiB

_applied: bool | None = None


def keep_freed_memory() -> bool:
    """Apply the policy once per process; whether it is in effect."""
    global _applied
    if _applied is None:
        _applied = _apply()
    return _applied


def _apply() -> bool:
    if os.environ.get("FOLD_KEEP_FREED_MEMORY", "0") != "1":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD))
