"""Backends by name, imported lazily: `import fold` never imports a backend's dependencies.

A backend turns a Program into a callable on flat lists of arrays. Choose one per function with
`fold.jit(f, backend=...)`, for a block of code with `with fold.use_backend(...)`, or for the process with the
FOLD_BACKEND environment variable.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
from typing import Callable, Iterator, Protocol, Sequence

import numpy as np

from fold.errors import FoldTypeError
from fold.ir import Program

CompiledProgram = Callable[[Sequence[np.ndarray]], list[np.ndarray]]


class Backend(Protocol):
    name: str

    def compile(self, program: Program) -> CompiledProgram: ...


_REGISTRY: dict[str, str] = {
    "numpy": "fold.runtime.backends.numpy_backend:NumpyBackend",
    "numba": "fold.runtime.numba_backend.backend:NumbaBackend",
    "cuda": "fold.runtime.cuda_backend.backend:CudaBackend",
}
_instances: dict[str, Backend] = {}
_local = threading.local()
DEFAULT_ORDER = ("numba",)


def available_backends() -> list[str]:
    return list(_REGISTRY)


def get_backend(name: str | None = None) -> Backend:
    """The backend called `name`, else the one chosen by `use_backend`, FOLD_BACKEND, or the default."""
    name = name or getattr(_local, "override", None) or os.environ.get("FOLD_BACKEND") or DEFAULT_ORDER[0]
    if name not in _REGISTRY:
        raise FoldTypeError(f"unknown backend {name!r}; available: {', '.join(_REGISTRY)}")
    backend = _instances.get(name)
    if backend is None:
        module_name, cls_name = _REGISTRY[name].split(":")
        backend = getattr(importlib.import_module(module_name), cls_name)()
        _instances[name] = backend
    return backend


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Run the fold calls in this block on backend `name` (unless a call names its own)."""
    get_backend(name)
    previous = getattr(_local, "override", None)
    _local.override = name
    try:
        yield
    finally:
        _local.override = previous
