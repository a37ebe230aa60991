"""x_t = a_t * x_{t-1} + b_t for all t at once, as a scan with a non-commutative operator, differentiated.

The affine maps x -> a x + b compose associatively (but not commutatively): (a1, b1) then (a2, b2) is
(a1 a2, a2 b1 + b2). A scan over those pairs gives every x_t in O(log n) parallel steps; its vjp uses the
generic scan rule (a linear recurrence solved by another scan), checked here against a Python loop and
central finite differences.
"""

from __future__ import annotations

import numpy as np

import fold


def compose(first, second):
    (a1, b1), (a2, b2) = first, second
    return a1 * a2, a2 * b1 + b2


def recurrence(a, b):
    return fold.scan(compose, (a, b), identity=(1.0, 0.0))[1]


def recurrence_loop(a, b):
    x, out = 0.0, []
    for at, bt in zip(a, b, strict=True):
        x = at * x + bt
        out.append(x)
    return np.array(out)


def main(n: int = 40, verbose: bool = True) -> dict:
    rng = np.random.default_rng(2)
    a, b, ybar = rng.uniform(0.5, 1.0, n), rng.normal(size=n), rng.normal(size=n)
    xs = fold.run(recurrence, a, b)
    abar, bbar = fold.vjp(recurrence, a, b)[1](ybar)
    eps = 1e-6
    fd_a = np.array([(recurrence_loop(a + eps * e, b) - recurrence_loop(a - eps * e, b)) @ ybar / (2 * eps) for e in np.eye(n)])
    fd_b = np.array([(recurrence_loop(a, b + eps * e) - recurrence_loop(a, b - eps * e)) @ ybar / (2 * eps) for e in np.eye(n)])
    errors = {"forward vs loop": float(np.max(np.abs(xs - recurrence_loop(a, b)))),
              "abar vs finite differences": float(np.max(np.abs(abar - fd_a))),
              "bbar vs finite differences": float(np.max(np.abs(bbar - fd_b)))}
    if verbose:
        print(f"linear recurrence of length {n}")
        for name, err in errors.items():
            print(f"  {name:<28} {err:.2e}")
    return errors


if __name__ == "__main__":
    main()
