"""NumPy implementations of every primitive on batched arrays (see runtime.interpreter)."""

from . import ad_support, control, elementwise, folds, gemm, structural  # noqa: F401  (importing registers the implementations)
