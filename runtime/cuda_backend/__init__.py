"""The cuda backend: folds lowered to Numba CUDA kernels (kernels.cuda), on a GPU or on Numba's CUDA
simulator (NUMBA_ENABLE_CUDASIM=1). See backend.py for what runs where, device.py for where values live.

`counting_transfers()` (a context manager yielding a `Transfers`) counts the host<->device copies of the
calls inside it; imported from device.py on first use, so importing this package imports no numba.cuda."""

from typing import Any

__all__ = ["Transfers", "counting_transfers"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import device

        return getattr(device, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
