"""Numba's disk cache, trusted only after checking: each compiled entry carries a checksum, and an entry that
fails it, or an index that does not read, is discarded (and compiled again) instead of loaded.

Numba loads a cache entry (`<function>.<n>.nbc`, the pickled object code) as it finds it: a flipped bit in
it is machine code run as it is, and a truncated or garbled index (`.nbi`) raises from deep inside the
first call. `cached_njit` compiles a function as `njit(cache=True)` does, but through `CheckedFunctionCache`,
which writes every entry as `sha256(payload) + payload` and checks it on load, under an index version of its
own (entries from an unchecked cache are stale, not trusted). Any entry or index that fails to read is
removed, with one warning per process, and the function is compiled and saved again: Numba writes each file
to a temporary name and renames it, so concurrent processes see a whole file or none.

Where the entries go: the cache locators of kernels/cpu/cache_stamp.py (NUMBA_CACHE_DIR, else beside the
source file, else -- for fold's own kernel files only, with NUMBA_CACHE_DIR unset -- Numba's user-wide
folder). Where none of them can write (a read-only cache folder), the function is compiled in memory in
every process, with one warning, rather than cached somewhere that was not configured. Numba's locator and
cache classes are not a public API: where they are missing, the function is compiled in memory.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import shutil
import threading
import warnings
from typing import Any, Callable

import numba
from numba import njit

from .cache_stamp import is_stamped_locator

_DIGEST = 32  # bytes of sha256
_warned: set[str] = set()
_warn_lock = threading.Lock()


def warn_once(kind: str, message: str) -> None:
    """One RuntimeWarning per `kind` per process: a bad cache says so once, not once per kernel."""
    with _warn_lock:
        if kind in _warned:
            return
        _warned.add(kind)
    warnings.warn(message, RuntimeWarning, stacklevel=3)


try:
    from numba.core.caching import FunctionCache, IndexDataCacheFile
except ImportError:  # pragma: no cover - Numba's internals moved: no disk cache (see the module docstring)
    FunctionCache = IndexDataCacheFile = None


if IndexDataCacheFile is not None:
    class ChecksummedCacheFile(IndexDataCacheFile):
        """Numba's index and data files, each data file checked against its sha256 before it is unpickled;
        an unreadable index or entry is removed and reads as missing."""

        def __init__(self, cache_path, filename_base, source_stamp):
            super().__init__(cache_path, filename_base, source_stamp)
            self._version = f"{numba.__version__}+fold-sha256"  # unchecked entries of plain Numba are stale

        def _save_data(self, name, data):
            payload = self._dump(data)
            with self._open_for_write(self._data_path(name)) as f:
                f.write(hashlib.sha256(payload).digest() + payload)

        def _load_data(self, name):
            path = self._data_path(name)
            with open(path, "rb") as f:
                blob = f.read()
            digest, payload = blob[:_DIGEST], blob[_DIGEST:]
            if len(digest) != _DIGEST or hashlib.sha256(payload).digest() != digest:
                raise ValueError("its checksum does not match its contents")
            return pickle.loads(payload)

        def _load_index(self):
            try:
                return super()._load_index()
            except Exception as err:  # noqa: BLE001 - any unreadable index is discarded, whatever it raises
                self._discard(self._index_path, err)
                return {}

        def load(self, key):
            overloads = self._load_index()
            name = overloads.get(key)
            if name is None:
                return None
            try:
                return self._load_data(name)
            except FileNotFoundError:
                return None
            except Exception as err:  # noqa: BLE001 - a corrupt entry is compiled again, never loaded
                self._discard(self._data_path(name), err)
                return None

        def _discard(self, path: str, err: Exception) -> None:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            except IsADirectoryError:
                shutil.rmtree(path, ignore_errors=True)
            except OSError:
                pass  # a read-only folder: the entry stays, and is checked (and refused) again next time
            warn_once("numba-entry", f"fold: a cached compilation in {os.path.dirname(path)} could not be used "
                                     f"({os.path.basename(path)}: {type(err).__name__}: {err}); it was discarded "
                                     f"and is compiled again")

    class CheckedFunctionCache(FunctionCache):
        """Numba's FunctionCache over a ChecksummedCacheFile."""

        def __init__(self, py_func):
            super().__init__(py_func)
            self._cache_file = ChecksummedCacheFile(self._cache_path, self._impl.filename_base,
                                                    self._impl.locator.get_source_stamp())

        def save_overload(self, sig, data):
            try:
                super().save_overload(sig, data)
            except OSError as err:  # a read-only cache: it serves what it has, and the rest runs from memory
                warn_once("not-saved", f"fold: a compiled kernel could not be saved in {self._cache_path} "
                                       f"({type(err).__name__}: {err}); it is compiled in memory in every process")


def cached_njit(fn: Callable, **options: Any) -> Any:
    """`numba.njit(**options)(fn)` with a checked disk cache where fold's locators give it a writable folder;
    compiled in memory (one warning per process) where they do not."""
    dispatcher = njit(**options)(fn)
    if FunctionCache is None:
        return dispatcher
    try:
        cache = CheckedFunctionCache(fn)
    except (RuntimeError, OSError):
        cache = None
    if cache is None or not is_stamped_locator(cache._impl.locator):
        warn_once("no-cache-folder", f"fold: no writable cache folder for compiled kernels (NUMBA_CACHE_DIR="
                                     f"{os.environ.get('NUMBA_CACHE_DIR', '<unset>')}, beside "
                                     f"{os.path.dirname(fn.__code__.co_filename)}); kernels are compiled in "
                                     f"memory in every process")
        return dispatcher
    dispatcher._cache = cache  # what njit(cache=True) does (Dispatcher.enable_caching), with our cache class
    return dispatcher
