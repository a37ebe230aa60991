"""Both exclusive scans of one sequence, consumed at once by a map, never stored:

    out[.][i] = mapper(c_0.., prefix_i, suffix_i, others[0][i], ...)
    prefix_i  = e . x_0 . ... . x_{i-1}          (the exclusive forward scan)
    suffix_i  = x_{i+1} . ... . x_{n-1} . e      (the exclusive reverse scan)

This is the shape of the generic vjp of a reduction (the cotangent of x_i is the vjp of l . x_i . r at
l = prefix_i, r = suffix_i), which would otherwise be two scans written out and a map reading them back.

The sequence is cut into blocks of B elements, and each block into L = LANES / k contiguous segments (the
last one also takes the remainder). 1. (parallel) every segment's total, the L segments of a block folded
interleaved in one loop (independent chains the CPU overlaps, as in kernels.cpu.reduce; more lanes of a
large element only spill registers); 2. (sequential) the exclusive prefix and suffix of the segment totals;
3. (parallel) per block, the forward scans of its L segments, interleaved, into a block-sized buffer, then
the backward walks, interleaved, carrying each segment's suffix and calling the mapper: the block is read
the second time from cache. A chain of combines runs at the operator's latency, and one segment per block
left the scans bound by it; with L segments, and a full block's segment length a literal (LLVM then
addresses the L lanes by constant offsets), the generic-rule gradients at 10^7 (fold.jit, alternating with
the kernel before in one process) took a * b 14.4 -> 9.2 ms, the pairwise operator 22.6 -> 18.1, the 2 x 2
matrices (one segment) 56.6 -> 49.6. Operand order is kept throughout (non-commutative operators are
correct); about 3n combines and one read of the input from memory beyond the fold's.

Tried and not kept (session 23): non-temporal stores of the output (x86 MOVNTSD through an LLVM intrinsic)
saved under 5% with one output and made four outputs, written backwards, 12x slower; storing the suffixes
in a second buffer so that the mapper runs in a loop LLVM vectorises was as fast for the 2 x 2 matrices
and slower for the others.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from . import host
from .codegen import call, compile_kernel, each, first_row, indent, names, signature
from .reduce import LANES, _lanes_loop

# Elements per block: the forward scan of a block is still in cache when the backward walk reads it. Not
# a power of two: segments a multiple of 4 KiB apart share cache sets (at 4096 elements and four segments, 9.8 ms
# against 9.0 at 8000; eight segments of 512 elements, 37.6 ms).
BLOCK = 8000
# The kernel's arguments, in order, as groups of values (kernels.cpu.codegen.signature): consts, leaves,
# others, the identity, the three scratch arrays, the outputs.
ARGUMENTS = ("c", "x", "y", "id", "tot", "pre", "suf", "out")


def _segments_per_block(k: int) -> int:
    """LANES / k chains per block: more lanes of a large element only spill registers."""
    return max(1, LANES // k)


def _source(k: int, m: int, c: int, r: int, block: int, layout: tuple[tuple[int, ...], ...]) -> str:
    lanes = _segments_per_block(k)
    last = lanes - 1

    def element(i: str) -> str:
        return ", ".join(f"x{j}[{i}]" for j in range(k))

    def forward(lane: int, i: str, at: str) -> str:  # buf[at] = the lane's running prefix, then x[i] folded in
        return each("buf{j}[" + at + f"] = a{lane}_" + "{j}", k) + "\n" + call(f"a{lane}_", "combine", f"{names(f'a{lane}_', k)}, {element(i)}", k)

    def backward(lane: int, i: str, at: str) -> str:  # out[i] = mapper(prefix, suffix, ..), then x[i] folded into the suffix
        args = ", ".join([f"c{j}" for j in range(c)] + [f"buf{j}[{at}]" for j in range(k)]
                         + [f"a{lane}_{j}" for j in range(k)] + [f"y{j}[{i}]" for j in range(m)])
        return "\n".join([call(f"e{lane}_", "mapper", args, r), each("out{j}[" + i + f"] = e{lane}_" + "{j}", r),
                          call(f"a{lane}_", "combine", f"{element(i)}, {names(f'a{lane}_', k)}", k)])

    def segment_values(source: str) -> str:
        return "\n".join(each(f"a{lane}_" + "{j} = " + source + "{j}[b * " + str(lanes) + f" + {lane}]", k) for lane in range(lanes))

    def interleaved(step) -> str:
        return "\n".join(step(lane, f"lo + {lane} * q + t", f"{lane} * q + t") for lane in range(lanes))

    def totals(q: str) -> str:
        return _lanes_loop(k, k, False, lanes, merge=False, q=q)

    def scans(q: str) -> str:  # the block's forward scans into buf, then its backward walks
        return f"""q = {q}
{segment_values("pre")}
for t in range(q):
{indent(interleaved(forward), 4)}
for i in range(lo + {lanes} * q, hi):
{indent(forward(last, "i", "i - lo"), 4)}
{segment_values("suf")}
for i in range(hi - 1, lo + {lanes} * q - 1, -1):
{indent(backward(last, "i", "i - lo"), 4)}
for t in range(q - 1, -1, -1):
{indent(interleaved(backward), 4)}"""

    def per_block(body) -> str:  # a full block's segment length is a literal: LLVM then addresses the lanes by constant offsets
        if lanes == 1:  # nothing to address: the body once, at half the compile time
            return body("hi - lo")
        return f"""if hi - lo == {block}:
{indent(body(str(block // lanes)), 4)}
else:
{indent(body(f"(hi - lo) // {lanes}"), 4)}"""

    groups = dict(zip(ARGUMENTS, layout, strict=True))

    def takes(*arguments: str) -> tuple[str, str]:  # a helper's parameters and their unpacking, indented
        params, rows = signature([(a, groups[a]) for a in arguments])
        return params, indent(rows, 4)

    params = takes(*ARGUMENTS)[0]
    (totals_params, totals_rows), (seeds_params, seeds_rows), (scans_params, scans_rows) = \
        takes("x", "id", "tot"), takes("id", "tot", "pre", "suf"), takes("c", "x", "y", "pre", "suf", "out")
    return f"""
def block_totals(b, n, {totals_params}):
{totals_rows}
    lo = b * {block}
    hi = min(lo + {block}, n)
{indent(per_block(totals), 4)}
{indent(chr(10).join(each("tot{j}[b * " + str(lanes) + f" + {lane}] = a{lane}_" + "{j}", k) for lane in range(lanes)), 4)}


def block_scans(b, n, {scans_params}):
{scans_rows}
    lo = b * {block}
    hi = min(lo + {block}, n)
{each("buf{j} = np.empty(hi - lo, x{j}.dtype)", k, 4)}
{indent(per_block(scans), 4)}


def seeds(nb, {seeds_params}):
{seeds_rows}
{each("acc{j} = id{j}", k, 4)}
    for s in range(nb * {lanes}):
{each("pre{j}[s] = acc{j}", k, 8)}
        {call("acc", "combine", f"{names('acc', k)}, " + ", ".join(f"tot{j}[s]" for j in range(k)), k)}
{each("acc{j} = id{j}", k, 4)}
    for s in range(nb * {lanes} - 1, -1, -1):
{each("suf{j}[s] = acc{j}", k, 8)}
        {call("acc", "combine", ", ".join(f"tot{j}[s]" for j in range(k)) + f", {names('acc', k)}", k)}


def kernel({params}):
    n = {first_row("x", layout[1])}.shape[0]
    nb = -(-n // {block})
    for b in prange(nb):
        block_totals(np.int64(b), n, {totals_params})
    seeds(nb, {seeds_params})
    for b in prange(nb):
        block_scans(np.int64(b), n, {scans_params})
"""


def segments(n: int, block: int, k: int) -> int:
    """How many segments the kernel cuts n elements of k leaves into, at `block` elements per block."""
    return -(-n // block) * _segments_per_block(k)


def scan_pair_map_kernel(combine: Any, mapper: Any, k: int, m: int, c: int, r: int, parallel: bool = True,
                         block: int = BLOCK, layout: tuple[tuple[int, ...], ...] | None = None) -> Any:
    """The compiled kernel(c.., x.., y.., id.., tot.., pre.., suf.., out..) for blocks of `block` elements,
    filling out_j in place; tot, pre and suf are scratch arrays with one entry per segment,
    segments(n, block, k) (allocated by the driver).

    `layout`: how many of each of ARGUMENTS each argument holds (default: one each). Runs of leaves, others
    and outputs that are the columns of one array (host.column_groups), scratch arrays of one dtype
    (host.packed_rows) and scalars of one dtype (host.packed_values) are passed as one array: Numba's
    compile time grows faster than linearly in a function's arguments (a prange loop calling a helper of
    90 arrays: 5.3 s, of 10: 0.75 s). With its helpers (block_totals, seeds, block_scans) taking only what
    they read, and the block loops written once where a block has one segment, the kernel of the
    Hessian-vector product of a logwsum fold with v in R^5 (k = 12, its operator no longer inlined: see
    runtime/numba_backend/codegen.py) compiled in 3.7 s instead of 23.5 (90 arguments); with v in R^16
    (k = 34) in 9.6 s instead of 128 (255 arguments)."""
    layout = layout or tuple((1,) * count for count in (c, k, m, k, k, k, k, r))
    key = ("scan_pair_map", combine, mapper, k, m, c, r, parallel, block, layout)
    return compile_kernel(key, lambda: _source(k, m, c, r, block, layout), {"combine": combine, "mapper": mapper},
                          parallel=parallel, helpers=("block_totals", "seeds", "block_scans"))


def scan_pair_map(combine: Any, k: int, identity: Sequence[Any], leaves: Sequence[np.ndarray], mapper: Any,
                  r: int, others: Sequence[np.ndarray] = (), consts: Sequence[Any] = (), *,
                  block: int = BLOCK, parallel: bool | None = None, out: Sequence[np.ndarray] | None = None,
                  carry: Sequence[Any] | None = None) -> tuple:
    """out_j[i] = mapper(*consts, *prefix_i, *suffix_i, *(y[i] for y in others)) for i < n, with prefix and
    suffix the exclusive forward and reverse scans of the k leaves under `combine` (see the module docstring).

    `leaves` and `others` are 1-D arrays of one length n; `mapper` returns r scalars (a scalar when r == 1).
    Returns a tuple of r arrays of the mapper's result dtypes: new ones, or `out` filled. `block` and
    `parallel` are for tests and tuning (default: parallel once there is enough work for two threads). Each
    block size is a kernel of its own (its full blocks' segment length is a literal). `carry`: the dtypes
    the scans are kept in (see host.carried_dtypes): `combine` takes and returns those; the mapper receives
    each suffix in them and each prefix rounded to its leaf's dtype (a block's prefixes wait in a buffer of
    those: a float64 buffer, twice the size, took a float32 gradient at 4 * 10^7 from 36 to 50 ms).
    """
    host.check_function(combine, "combine")
    host.check_function(mapper, "mapper")
    k, r, block = host.check_count(k, "k"), host.check_count(r, "r"), host.check_count(block, "block")
    leaves = host.check_arrays(leaves, k, 1, "leaves")
    if isinstance(others, np.ndarray):
        raise TypeError(f"others must be a sequence of 1-D arrays, got one array of shape {others.shape}")
    others = host.check_arrays(others, len(others), 1, "others") if len(others) else []
    if others and others[0].shape != leaves[0].shape:
        raise ValueError(f"others must have the leaves' shape {leaves[0].shape}, got {others[0].shape}")
    consts = host.check_scalars(consts, "consts")
    elements = [a.dtype for a in leaves]
    dtypes = host.carried_dtypes(carry, elements)
    ident = host.cast_identity(identity, dtypes)
    host.check_combine(combine, dtypes)
    out_dtypes = host.result_dtypes(mapper, [np.asarray(v).dtype for v in consts] + elements + dtypes + [y.dtype for y in others],
                                    r, "mapper")
    n = leaves[0].shape[0]
    outs = host.outputs(out, out_dtypes, n, "out", reads=[*leaves, *others])
    if n == 0:
        return outs
    blocks = -(-n // block)
    segs = segments(n, block, k)
    (tot, tot_sizes), (pre, pre_sizes), (suf, suf_sizes) = (host.packed_rows(dtypes, segs) for _ in range(3))
    (c_args, c_sizes), (ids, id_sizes) = host.packed_values(consts, [np.asarray(v).dtype for v in consts]), \
        host.packed_values(ident, dtypes)
    (xs, x_sizes), (ys, y_sizes), (out_args, out_sizes) = (host.column_groups(a) for a in (leaves, others, outs))
    threaded = host.num_chunks(n, None) > 1 if parallel is None else bool(parallel)
    layout = (c_sizes, x_sizes, y_sizes, id_sizes, tot_sizes, pre_sizes, suf_sizes, out_sizes)
    kernel = scan_pair_map_kernel(combine, mapper, k, len(others), len(consts), r, threaded and blocks > 1, block, layout)
    kernel(*c_args, *xs, *ys, *ids, *tot, *pre, *suf, *out_args)
    return outs
