"""Numba's on-disk cache, made to notice when fold's own kernel code changes.

Numba keys a cached compilation on the source file of the function it compiled (a hash of its text), not
on the functions that one calls from other files (Numba's "Notes on Caching": "cache invalidation fails to
recognize changes in symbols defined in another file"). kernels/cpu/logsumexp.py calls the vector exp of
kernels/cpu/vector_math.py, and every generated module (kernels.cpu.modules) calls helpers from kernels/
and runtime/numba_backend/: after an edit of those helpers alone, or an upgrade of fold that changes only
them, Numba would load machine code compiled from the old helpers. This was seen: a logsumexp compiled
while vector_math.py held an experiment ran at half speed from the cache long after the experiment was
undone.

`install()` puts cache locators in front of Numba's own for exactly those functions (files under kernels/
and runtime/numba_backend/, and the generated modules), which behave as Numba's but stamp each entry with
a digest of all of those source files too, so that a change to any of them makes every such entry stale.
Numba falls back to the folder beside the source, then to its user-wide one (~/.cache/numba), when the
configured one cannot be written; fold's locators never leave NUMBA_CACHE_DIR when it is set, and never
put a generated module's code in the user-wide folder (kernels/cpu/checked_cache.py then compiles in
memory). It uses Numba's locator classes (numba.core.caching), which are not a public API: if they are missing, the
locators are not installed and a warning says that the cache must be cleared by hand after changing fold.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE_FOLDERS = (ROOT / "kernels", ROOT / "runtime" / "numba_backend")
GENERATED_PREFIX = "fold_gen_"  # kernels.cpu.modules.PREFIX (not imported: that module imports numba's njit)


@lru_cache(maxsize=1)
def sources_digest() -> str:
    """A digest of the text of every .py file under SOURCE_FOLDERS (read once per process)."""
    digest = hashlib.sha256()
    for folder in SOURCE_FOLDERS:
        for path in sorted(folder.rglob("*.py")):
            digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def is_stamped(py_file: str) -> bool:
    """Whether functions compiled from this file get the sources digest in their cache stamp."""
    path = Path(py_file).resolve()  # as ROOT is: a checkout reached through a symbolic link still matches
    return path.name.startswith(GENERATED_PREFIX) or any(folder in path.parents for folder in SOURCE_FOLDERS)


class _StampedLocator:
    """Mixed in before one of Numba's locators: the same cache folder, a stamp that also covers fold's
    kernel sources, and only for the files `is_stamped` names (Numba's own locators take the rest). A folder
    that exists but cannot be written is accepted for loading (a read-only cache still serves what it has;
    kernels/cpu/checked_cache.py does not save there)."""

    def get_source_stamp(self):
        return (super().get_source_stamp(), sources_digest())

    def ensure_cache_path(self):
        try:
            super().ensure_cache_path()
        except OSError:
            path = self.get_cache_path()
            if not (os.path.isdir(path) and os.access(path, os.R_OK | os.X_OK)):
                raise

    @classmethod
    def from_function(cls, py_func, py_file):
        return super().from_function(py_func, py_file) if cls.takes(py_file) else None

    @classmethod
    def takes(cls, py_file: str) -> bool:
        return is_stamped(py_file)


class _StampedUnconfigured(_StampedLocator):
    """A folder Numba picks when NUMBA_CACHE_DIR is not set (beside the source): never when it is set, so
    that a process given a cache folder caches nowhere else (if that folder cannot be written,
    kernels/cpu/checked_cache.py compiles in memory)."""

    @classmethod
    def takes(cls, py_file: str) -> bool:
        return is_stamped(py_file) and not os.environ.get("NUMBA_CACHE_DIR")


class _StampedUserWide(_StampedUnconfigured):
    """Numba's user-wide folder (~/.cache/numba): for fold's own kernel files only, never for a generated
    module, which lives in the cache folder fold was given (FOLD_CACHE_DIR) and is cached beside it or not
    at all."""

    @classmethod
    def takes(cls, py_file: str) -> bool:
        return super().takes(py_file) and not Path(py_file).name.startswith(GENERATED_PREFIX)


def is_stamped_locator(locator: object) -> bool:
    """Whether Numba picked one of fold's locators (not one of its own, which would cache elsewhere)."""
    return isinstance(locator, _StampedLocator)


def cache_impl() -> type:
    """Numba's class that picks a locator for each cached function (CacheImpl; _CacheImpl before 0.59)."""
    from numba.core import caching

    found = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl", None)
    if found is None or not hasattr(found, "_locator_classes"):
        raise AttributeError("numba.core.caching has no CacheImpl with _locator_classes")
    return found


def install() -> bool:
    """Put the stamped locators first in Numba's list (once). Returns whether they are in place."""
    try:
        from numba.core import caching

        impl = cache_impl()
        bases = (caching.UserProvidedCacheLocator, caching.InTreeCacheLocator, caching.UserWideCacheLocator)
    except (ImportError, AttributeError) as err:
        warnings.warn(f"fold: Numba's cache locators were not found ({err}); after changing fold's kernels, "
                      "clear NUMBA_CACHE_DIR by hand", RuntimeWarning, stacklevel=2)
        return False
    if any(issubclass(c, _StampedLocator) for c in impl._locator_classes):
        return True
    mixins = (_StampedLocator, _StampedUnconfigured, _StampedUserWide)
    stamped = [type(f"Stamped{base.__name__}", (mixin, base), {}) for mixin, base in zip(mixins, bases, strict=True)]
    impl._locator_classes = stamped + list(impl._locator_classes)
    return True
