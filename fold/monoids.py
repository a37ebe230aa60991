"""The built-in monoids. Each is commutative; the D of Theorem 2.1 comes with the monoid issue (d=None for now)."""

from __future__ import annotations

import numpy as np

from . import ops
from .monoid import Monoid

sum = Monoid(lambda a, b: a + b, 0.0, commutative=True, name="sum")  # noqa: A001
prod = Monoid(lambda a, b: a * b, 1.0, commutative=True, name="prod")
min = Monoid(lambda a, b: ops.minimum(a, b), np.inf, commutative=True, name="min")  # noqa: A001
max = Monoid(lambda a, b: ops.maximum(a, b), -np.inf, commutative=True, name="max")  # noqa: A001
logaddexp = Monoid(lambda a, b: ops.logaddexp(a, b), -np.inf, commutative=True, name="logaddexp")

__all__ = ["sum", "prod", "min", "max", "logaddexp"]
