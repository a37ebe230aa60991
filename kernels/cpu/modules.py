"""Generated source as modules named by a hash of their text, kept on disk so that Numba's cache can keep
what it compiled from them between processes.

Numba's `cache=True` keys a compiled function on its source file and bytecode, not on the functions it
calls. A module here is named `fold_gen_<hash of its text>` and calls only what it defines, what libraries
provide, and what it imports from other such modules, so its text fixes its behaviour: a cached compilation
found for it can belong to no other code. `load_module` writes the file once (atomically), checks it against
its name whenever it is loaded (rewriting it if it differs), runs the checked text, and njit-compiles the
functions named in `jit` with a checked disk cache (kernels/cpu/checked_cache.py). Those options are written into the text as its
last line, so they name the module too: Numba's cache does not key on them (a serial and a parallel
compilation of one function would share one entry), and one name is one module per process.

Where the files go: `$FOLD_CACHE_DIR/kernels`, by default `~/.cache/fold/kernels` (under $XDG_CACHE_HOME
if set); Numba writes its cache beside them (or under $NUMBA_CACHE_DIR). `FOLD_CACHE_DIR=""` turns the
disk cache off: modules are then made in memory and compiled in every process.
"""

from __future__ import annotations

import hashlib
import linecache
import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path
from types import FunctionType, ModuleType
from typing import Any

from numba import njit

from .checked_cache import cached_njit, warn_once

PREFIX = "fold_gen_"
_LOCK = threading.RLock()


def cache_dir() -> Path | None:
    """The folder for generated modules, or None when the disk cache is off."""
    root = os.environ.get("FOLD_CACHE_DIR")
    if root is None:
        root = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "fold")
    return Path(root) / "kernels" if root else None


def is_content_addressed(fn: Any) -> bool:
    """Whether `fn` (a Numba dispatcher or a function) is defined in a module made by `load_module`."""
    module = sys.modules.get(getattr(getattr(fn, "py_func", fn), "__module__", None) or "")
    return bool(getattr(module, "__fold_content_addressed__", False))


def import_line(fn: Any, alias: str) -> str:
    """`from <module> import <name> as alias` for a content-addressed function."""
    py_func = getattr(fn, "py_func", fn)
    return f"from {py_func.__module__} import {py_func.__name__} as {alias}"


def load_module(source: str, jit: dict[str, dict[str, Any]]) -> ModuleType:
    """The module with this text (made once per process), its functions named in `jit` compiled by
    numba.njit with those options (and `cache=True` when the module has a file). The same source with other
    options is another module."""
    source = source.rstrip("\n") + "\n\n" + _options_line(jit) + "\n"
    name = PREFIX + hashlib.sha256(source.encode()).hexdigest()[:24]
    with _LOCK:
        module = sys.modules.get(name)
        if module is not None:
            return module
        folder = cache_dir()
        path = cached_source(folder, name, source) if folder is not None else None
        module = ModuleType(name)
        filename = str(path) if path is not None else f"<{name}>"
        if path is None:
            linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        else:
            module.__file__ = filename
        sys.modules[name] = module  # before running it: it may import others of its kind
        # the text checked against the name, not the file read again: what runs is what the hash names
        exec(compile(source, filename, "exec"), module.__dict__)
        for fn_name, options in jit.items():
            fn = getattr(module, fn_name)
            setattr(module, fn_name, cached_njit(fn, **options) if path is not None else njit(**options)(fn))
        module.__fold_content_addressed__ = True
        return module


def _options_line(jit: dict[str, dict[str, Any]]) -> str:
    """`jit` as a comment, the same text for the same options (fastmath's set sorted)."""
    def canonical(value: Any) -> Any:
        return sorted(value) if isinstance(value, (set, frozenset)) else value
    return "# njit: " + "; ".join(f"{fn}({', '.join(f'{k}={canonical(v)!r}' for k, v in sorted(options.items()))})"
                                  for fn, options in sorted(jit.items()))


def cached_source(folder: Path, name: str, source: str) -> Path | None:
    """The module's file, holding exactly `source`: written if absent, and rewritten if what is there differs
    (a flipped bit, a truncation, garbage, a directory in its place), with one warning per process; None if
    the folder cannot be written and the file is not already right (then: no disk cache for this module)."""
    path = folder / f"{name}.py"
    try:
        if path.read_text() == source:
            return path
        problem = "its text does not match the hash in its name"
    except FileNotFoundError:
        problem = None
    except (OSError, UnicodeDecodeError) as err:
        problem = f"{type(err).__name__}: {err}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if path.is_dir():
            aside = Path(tempfile.mkdtemp(dir=folder, suffix=".discarded"))
            os.replace(path, aside / "old")  # moved aside first: another process may be doing the same
            shutil.rmtree(aside, ignore_errors=True)
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(source)
        os.replace(tmp, path)  # atomic: a concurrent process sees the whole file or none
    except OSError as err:
        warn_once("no-cache-folder", f"fold: the kernel cache folder {folder} cannot be written ({err}); "
                                     f"kernels are compiled in memory in every process")
        return None
    if problem is not None:
        warn_once("generated-source", f"fold: the cached kernel source {path} could not be used ({problem}); "
                                      f"it was written again")
    return path


def file_digest(module: ModuleType) -> str:
    """A short hash of a module's source file, for generated text that must change when that module does
    (a generated module that calls it is then another module, with its own cache entry)."""
    return hashlib.sha256(Path(module.__file__).read_bytes()).hexdigest()[:16]


def variant(fn: FunctionType, label: str) -> FunctionType:
    """A copy of `fn` named `<name>_<label>`, for one of several njit compilations of the same source with
    different options (serial, parallel): Numba names a cache entry by the function's qualified name and line
    and does not key it on the options, so that two compilations of `fn` itself would load each other's code."""
    copy = FunctionType(fn.__code__, fn.__globals__, f"{fn.__name__}_{label}", fn.__defaults__, fn.__closure__)
    copy.__qualname__ = f"{fn.__qualname__}_{label}"
    copy.__module__ = fn.__module__
    copy.__doc__ = fn.__doc__
    return copy
