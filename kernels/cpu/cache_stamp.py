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
It uses Numba's locator classes (numba.core.caching), which are not a public API: if they are missing, the
locators are not installed and a warning says that the cache must be cleared by hand after changing fold.
"""

from __future__ import annotations

import hashlib
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
    kernel sources, and only for the files `is_stamped` names (Numba's own locators take the rest)."""

    def get_source_stamp(self):
        return (super().get_source_stamp(), sources_digest())

    @classmethod
    def from_function(cls, py_func, py_file):
        return super().from_function(py_func, py_file) if is_stamped(py_file) else None


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
    stamped = [type(f"Stamped{base.__name__}", (_StampedLocator, base), {}) for base in bases]
    impl._locator_classes = stamped + list(impl._locator_classes)
    return True
