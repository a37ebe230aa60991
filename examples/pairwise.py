"""The sum of all pairwise products P = sum_{j<i} w_j w_i, from the SC22 AD slides, defined two ways:

- sequentially, a loop over seqop (P, S) w = (P + S * w, S + w);
- in parallel, a reduce with parop (P1, S1) (P2, S2) = (P1 + P2 + S1 * S2, S1 + S2) over (0, w_i):
  the `pairwise` monoid, whose D makes the Theorem 2.1 gradient shortcut available.

All gradients (loop, generic reduce rule, monoid shortcut) agree with the closed form dP/dw_i = S - w_i.
"""

from __future__ import annotations

import numpy as np

import fold


def pairwise_sequential(w):
    def seqop(i, state):
        p, s = state
        return p + s * w[i], s + w[i]

    return fold.loop(seqop, (0.0, 0.0), w.shape[0])[0]


def pairwise_parallel(w):
    return fold.reduce(fold.monoids.pairwise, (fold.map(lambda x: x * 0.0, w), w))[0]


def main(n: int = 50, verbose: bool = True) -> dict:
    rng = np.random.default_rng(1)
    w = rng.normal(size=n)
    closed_form = ((w.sum() ** 2 - (w * w).sum()) / 2, w.sum() - w)
    values = {"sequential": fold.run(pairwise_sequential, w), "parallel": fold.run(pairwise_parallel, w)}
    grads = {
        "loop": fold.grad(pairwise_sequential)(w),
        "generic": fold.grad(pairwise_parallel, reduce_rule="generic")(w),
        "monoid": fold.grad(pairwise_parallel, reduce_rule="monoid")(w),
    }
    errors = {f"value {k}": abs(float(v) - closed_form[0]) for k, v in values.items()}
    errors.update({f"grad {k}": float(np.max(np.abs(g - closed_form[1]))) for k, g in grads.items()})
    if verbose:
        print(f"pairwise products of {n} numbers: P = {closed_form[0]:.6f}")
        for name, err in errors.items():
            print(f"  {name:<16} error {err:.2e}")
        print(fold.compare_rules(pairwise_parallel, (w,), 1.0))
    return errors


if __name__ == "__main__":
    main()
