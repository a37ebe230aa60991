"""Both exclusive scans of one sequence, consumed at once by a map, never stored:

    out[.][i] = mapper(c_0.., prefix_i, suffix_i, others[0][i], ...)
    prefix_i  = e . x_0 . ... . x_{i-1}          (the exclusive forward scan)
    suffix_i  = x_{i+1} . ... . x_{n-1} . e      (the exclusive reverse scan)

This is the shape of the generic vjp of a reduction (the cotangent of x_i is the vjp of l . x_i . r at
l = prefix_i, r = suffix_i), which would otherwise be two scans written out and a map reading them back.

The sequence is cut into blocks of B elements. 1. (parallel) every block's total, folded in order (as
LANES / k interleaved sub-blocks, as in kernels.cpu.reduce: one chain runs at the operator's latency; more
lanes of a large element only spill registers: measured at 10^7, the a * b gradient 16.8 -> 14 ms, the
pairwise one 27 -> 23 ms, the 2 x 2 matrices' unchanged at one lane, 20% slower at four);
2. (sequential) the exclusive prefix and suffix of the block totals; 3. (parallel) per block, the forward
scan into a block-sized buffer, then a backward walk carrying the suffix that calls the mapper: the block
is read the second time from cache. Operand order is kept throughout (non-commutative operators are
correct); about 3n combines and one read of the input from memory beyond the fold's.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from . import host
from .codegen import call, compile_kernel, each, indent, names
from .reduce import LANES, _lanes_loop

# Elements per block: the forward scan of a block is still in cache when the backward walk reads it.
BLOCK = 4096


def _source(k: int, m: int, c: int, r: int) -> str:
    x_i = ", ".join(f"x{j}[i]" for j in range(k))
    tot_b = ", ".join(f"tot{j}[b]" for j in range(k))
    args = ", ".join([f"c{j}" for j in range(c)] + [f"buf{j}[i - lo]" for j in range(k)]
                     + [f"acc{j}" for j in range(k)] + [f"y{j}[i]" for j in range(m)])
    consts, others = "".join(f"c{j}, " for j in range(c)), "".join(f"y{j}, " for j in range(m))
    return f"""
def kernel(B, {consts}{names("x", k)}, {others}{names("id", k)}, {names("tot", k)}, {names("pre", k)}, {names("suf", k)}, {names("out", r)}):
    n = x0.shape[0]
    nb = tot0.shape[0]
    for b in prange(nb):
        lo = b * B
        hi = min(lo + B, n)
{indent(_lanes_loop(k, k, False, max(1, LANES // k)), 8)}
{each("tot{j}[b] = acc{j}", k, 8)}
{each("acc{j} = id{j}", k, 4)}
    for b in range(nb):
{each("pre{j}[b] = acc{j}", k, 8)}
        {call("acc", "combine", f"{names('acc', k)}, {tot_b}", k)}
{each("acc{j} = id{j}", k, 4)}
    for b in range(nb - 1, -1, -1):
{each("suf{j}[b] = acc{j}", k, 8)}
        {call("acc", "combine", f"{tot_b}, {names('acc', k)}", k)}
    for b in prange(nb):
        lo = b * B
        hi = min(lo + B, n)
{each("buf{j} = np.empty(hi - lo, x{j}.dtype)", k, 8)}
{each("acc{j} = pre{j}[b]", k, 8)}
        for i in range(lo, hi):
{each("buf{j}[i - lo] = acc{j}", k, 12)}
            {call("acc", "combine", f"{names('acc', k)}, {x_i}", k)}
{each("acc{j} = suf{j}[b]", k, 8)}
        for i in range(hi - 1, lo - 1, -1):
            {call("e", "mapper", args, r)}
{each("out{j}[i] = e{j}", r, 12)}
            {call("acc", "combine", f"{x_i}, {names('acc', k)}", k)}
"""


def scan_pair_map_kernel(combine: Any, mapper: Any, k: int, m: int, c: int, r: int, parallel: bool = True) -> Any:
    """The compiled kernel(B, c.., x.., y.., id.., tot.., pre.., suf.., out..), filling out_j in place; tot, pre
    and suf are scratch arrays with one entry per block (allocated by the driver)."""
    key = ("scan_pair_map", combine, mapper, k, m, c, r, parallel)
    return compile_kernel(key, lambda: _source(k, m, c, r), {"combine": combine, "mapper": mapper}, parallel=parallel)


def scan_pair_map(combine: Any, k: int, identity: Sequence[Any], leaves: Sequence[np.ndarray], mapper: Any,
                  r: int, others: Sequence[np.ndarray] = (), consts: Sequence[Any] = (), *,
                  block: int = BLOCK, parallel: bool | None = None, out: Sequence[np.ndarray] | None = None) -> tuple:
    """out_j[i] = mapper(*consts, *prefix_i, *suffix_i, *(y[i] for y in others)) for i < n, with prefix and
    suffix the exclusive forward and reverse scans of the k leaves under `combine` (see the module docstring).

    `leaves` and `others` are 1-D arrays of one length n; `mapper` returns r scalars (a scalar when r == 1).
    Returns a tuple of r arrays of the mapper's result dtypes: new ones, or `out` filled. `block` and
    `parallel` are for tests and tuning (default: parallel once there is enough work for two threads).
    """
    host.check_function(combine, "combine")
    host.check_function(mapper, "mapper")
    k, r, block = host.check_count(k, "k"), host.check_count(r, "r"), host.check_count(block, "block")
    leaves = host.check_arrays(leaves, k, 1, "leaves")
    others = host.check_arrays(others, len(others), 1, "others") if len(others) else []
    if others and others[0].shape != leaves[0].shape:
        raise ValueError(f"others must have the leaves' shape {leaves[0].shape}, got {others[0].shape}")
    consts = host.check_scalars(consts, "consts")
    dtypes = [a.dtype for a in leaves]
    ident = host.cast_identity(identity, dtypes)
    host.check_combine(combine, dtypes)
    out_dtypes = host.result_dtypes(mapper, [np.asarray(v).dtype for v in consts] + dtypes * 2 + [y.dtype for y in others],
                                    r, "mapper")
    n = leaves[0].shape[0]
    outs = host.outputs(out, out_dtypes, n, "out")
    if n == 0:
        return outs
    blocks = -(-n // block)
    scratch = [np.empty(blocks, d) for d in dtypes for _ in range(3)]
    tot, pre, suf = scratch[0::3], scratch[1::3], scratch[2::3]
    threaded = host.num_chunks(n, None) > 1 if parallel is None else bool(parallel)
    kernel = scan_pair_map_kernel(combine, mapper, k, len(others), len(consts), r, threaded and blocks > 1)
    kernel(block, *consts, *leaves, *others, *ident, *tot, *pre, *suf, *outs)
    return outs
