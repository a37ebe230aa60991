"""Parallel inclusive/exclusive, forward/reverse scan of 1-D arrays of k-leaf elements.

With x_0 .. x_{n-1} and the operator '.', the four variants are

    inclusive forward   y_i = x_0 . ... . x_i
    exclusive forward   y_i = e . x_0 . ... . x_{i-1}          (y_0 = e, the identity)
    inclusive reverse   y_i = x_i . ... . x_{n-1}
    exclusive reverse   y_i = x_{i+1} . ... . x_{n-1} . e      (y_{n-1} = e)

Reverse is the forward scan of the reversed sequence under the swapped operator (a, b) -> b . a, reversed
back; the kernel computes exactly that in place, walking each chunk from its right end and combining as
combine(x_i, acc), so no array is copied and operand order is kept.

Three phases over T contiguous chunks (work-efficient: about 2n combines in all; T = 1 is one plain
loop with no parallel region):
  1. (parallel) the total of every chunk but the last (forward) or first (reverse), folded in order (as
     interleaved sub-chunks, like the parallel reduce);
  2. (sequential) the exclusive scan of the totals, in chunk order: the seed of each chunk;
  3. (parallel) each chunk scanned from its seed.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from . import host
from .codegen import call, compile_kernel, each, indent, names
from .reduce import LANES, _lanes_loop


def _scan_chunk(k: int) -> str:
    """Scan the elements lo <= i < hi into out_j, from the seed acc_0.. (all four variants)."""
    acc, x_i = names("acc", k), ", ".join(f"x{j}[i]" for j in range(k))
    forward, backward = call("acc", "combine", f"{acc}, {x_i}", k), call("acc", "combine", f"{x_i}, {acc}", k)
    store = each("out{j}[i] = acc{j}", k, 8)
    return f"""if reverse and exclusive:
    for i in range(hi - 1, lo - 1, -1):
{store}
        {backward}
elif reverse:
    for i in range(hi - 1, lo - 1, -1):
        {backward}
{store}
elif exclusive:
    for i in range(lo, hi):
{store}
        {forward}
else:
    for i in range(lo, hi):
        {forward}
{store}"""


def _scan_source(k: int) -> str:
    x_i = ", ".join(f"x{j}[i]" for j in range(k))
    seed_nxt, nxt_seed = f"{names('seed', k)}, {names('nxt', k)}", f"{names('nxt', k)}, {names('seed', k)}"
    return f"""
def kernel(T, exclusive, reverse, {names("x", k)}, {names("id", k)}, {names("tot", k)}, {names("out", k)}):
    n = x0.shape[0]
    if T == 1:  # no parallel region at all
        lo = 0
        hi = n
{each("acc{j} = id{j}", k, 8)}
{indent(_scan_chunk(k), 8)}
        return
    # 1. chunk totals (the last chunk's is not needed forward, the first's not in reverse)
    for t in prange(T):
        if (reverse and t > 0) or (not reverse and t < T - 1):
            lo = t * n // T
            hi = (t + 1) * n // T
{indent(_lanes_loop(k, k, False, LANES), 12)}
{each("tot{j}[t] = acc{j}", k, 12)}
    # 2. seeds: tot[t] becomes the combination of the totals of the chunks before t (after t in reverse)
{each("seed{j} = id{j}", k, 4)}
    if reverse:
        for t in range(T - 1, -1, -1):
{each("nxt{j} = tot{j}[t]", k, 12)}
{each("tot{j}[t] = seed{j}", k, 12)}
            if t > 0:
                {call("seed", "combine", nxt_seed, k)}
    else:
        for t in range(T):
{each("nxt{j} = tot{j}[t]", k, 12)}
{each("tot{j}[t] = seed{j}", k, 12)}
            if t < T - 1:
                {call("seed", "combine", seed_nxt, k)}
    # 3. every chunk scanned from its seed
    for t in prange(T):
        lo = t * n // T
        hi = (t + 1) * n // T
{each("acc{j} = tot{j}[t]", k, 8)}
{indent(_scan_chunk(k), 8)}
"""


def scan_kernel(combine: Any, k: int, parallel: bool = True) -> Any:
    """The compiled kernel(T, exclusive, reverse, x_0.., id_0.., tot_0.., out_0..), filling out_j in place.

    tot_j are T-element scratch arrays; out_j are the n-element outputs. All allocated by the driver.
    """
    return compile_kernel(("scan", combine, k, parallel), lambda: _scan_source(k), {"combine": combine}, parallel=parallel)


def scan(combine: Any, k: int, identity: Sequence[Any], leaves: Sequence[np.ndarray],
         exclusive: bool = False, reverse: bool = False, *, chunks: int | None = None,
         out: Sequence[np.ndarray] | None = None) -> tuple:
    """Scan k 1-D arrays of one length n (the leaves of n elements) with `combine`.

    Returns a tuple of k arrays of length n with the leaves' dtypes (see the module docstring for the
    four variants): new ones, or `out` filled. `chunks` overrides the number of parallel chunks (default:
    one per Numba thread).
    """
    host.check_function(combine, "combine")
    k = host.check_count(k, "k")
    leaves = host.check_arrays(leaves, k, 1, "leaves")
    dtypes = [a.dtype for a in leaves]
    ident = host.cast_identity(identity, dtypes)
    host.check_combine(combine, dtypes)
    n = leaves[0].shape[0]
    outs = host.outputs(out, dtypes, n, "out")
    if n == 0:
        return outs
    T = host.num_chunks(n, chunks)
    totals = [np.empty(T, d) for d in dtypes]
    scan_kernel(combine, k, T > 1)(T, bool(exclusive), bool(reverse), *leaves, *ident, *totals, *outs)
    return outs
