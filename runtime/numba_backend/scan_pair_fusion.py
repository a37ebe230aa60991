"""Fusion for the numba backend: an exclusive forward scan and an exclusive reverse scan of the same sequence
under the same operator, read only by one map, become one kernel (kernels.cpu.scan_pair_map) that never
writes the scans out. This is the generic vjp of a reduction (ad/reduce_rules.py: the cotangent of a_i is the
vjp of l_i . a_i . r_i), which otherwise writes two scans of n elements and reads them back.

`fuse_scan_pairs(program)` rewrites the top level of a program; `FusedScanPairMap` is internal to the backend,
and its numpy implementation runs the three statements it replaced, so declining is always possible.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from fold.ir import Let, Primitive, Program, Var, reorder_inputs, same_atom, use_counts, with_statements_replaced
from fold.primitives import Map, Scan

from ..interpreter import numpy_impls
from .codegen import compile_problem, compile_scalar_program, program_source
from .lowering import (_allocate, _identity, _scalar_operator, _split, decline, numba_impls, reference_until_hot,
                       run_kernel, worth_compiling)
from .wide_folds import rounding_inputs


@dataclass(frozen=True)
class FusedScanPairMap(Primitive):
    """map(f, ..., scan_excl(op, xs), ..., scan_excl_rev(op, xs), ...): args are the scans' identity and xs,
    the map's consts, then the map's other operands. `roles[p]` says where the map's operand p comes from:
    ("prefix", j) or ("suffix", j) for leaf j of a scan, ("other", i) for the i-th other operand."""

    forward: Scan
    backward: Scan
    map: Map
    roles: tuple
    kernel_body: Program  # the map body with its inputs in the kernel's order (see _canonical_body)
    name = "scan_pair_map"
    backend_internal = True
    num_consts = 0  # for the printer: the bodies are shown with all their inputs as parameters

    def bodies(self) -> list[Program]:
        return [self.forward.body, self.map.body]


def _same_compilable_operator(a: Program, b: Program) -> bool:
    """The same lambda, one a kernel can run: one object, or (AD passes copy bodies) the same function text."""
    if compile_problem(a) is not None:
        return False
    return a is b or (compile_problem(b) is None and program_source(a) == program_source(b))


def _pair(first: Let, second: Let) -> tuple[Let, Let] | None:
    """(forward, backward) if the two statements are the exclusive scans of one sequence both ways."""
    a, b = first.prim, second.prim
    if not (isinstance(a, Scan) and isinstance(b, Scan)) or a.num_consts or b.num_consts:
        return None
    same = (_same_compilable_operator(a.body, b.body) and len(first.args) == len(second.args)
            and all(same_atom(x, y) for x, y in zip(first.args, second.args)))
    if not (same and a.exclusive and b.exclusive and a.reverse != b.reverse):
        return None
    return (second, first) if a.reverse else (first, second)


def _fused(map_stmt: Let, producer: dict, uses: Counter) -> tuple[Let, set[int]] | None:
    prim: Map = map_stmt.prim
    operands = list(map_stmt.args[prim.num_consts:])
    scans = []
    for v in operands:
        stmt = producer.get(v) if isinstance(v, Var) else None
        if stmt is not None and isinstance(stmt.prim, Scan) and all(stmt is not s for s in scans):
            scans.append(stmt)
    if len(scans) != 2:
        return None
    pair = _pair(*scans)
    if pair is None:
        return None
    forward, backward = pair
    scanned = list(forward.outs) + list(backward.outs)
    if any(uses[v] != 1 or operands.count(v) != 1 for v in scanned):
        return None
    roles, others = [], []
    for v in operands:
        if v in forward.outs:
            roles.append(("prefix", list(forward.outs).index(v)))
        elif v in backward.outs:
            roles.append(("suffix", list(backward.outs).index(v)))
        else:
            roles.append(("other", len(others)))
            others.append(v)
    body = _canonical_body(prim, tuple(roles), forward.prim.num_leaves)
    if compile_problem(body) is not None:
        return None  # the map stays batched NumPy, the scans kernels of their own
    fused = FusedScanPairMap(forward.prim, backward.prim, prim, tuple(roles), body)
    args = tuple(forward.args) + tuple(map_stmt.args[: prim.num_consts]) + tuple(others)
    return Let(map_stmt.outs, fused, args), {id(forward), id(backward)}


def fuse_scan_pairs(program: Program) -> Program:
    uses = use_counts(program)
    producer = {v: s for s in program.stmts for v in s.outs}
    replaced: dict[int, Let] = {}
    removed: set[int] = set()
    for stmt in program.stmts:
        if isinstance(stmt.prim, Map):
            found = _fused(stmt, producer, uses)
            if found is not None and not (found[1] & removed):
                replaced[id(stmt)], gone = found
                removed |= gone
    return with_statements_replaced(program, replaced, removed)


def _split_args(prim: FusedScanPairMap, args: list) -> tuple[list, list, list, list]:
    k = prim.forward.num_leaves
    nc = prim.map.num_consts
    return args[:k], args[k: 2 * k], args[2 * k: 2 * k + nc], args[2 * k + nc:]


@numpy_impls.register(FusedScanPairMap)
def _reference(prim: FusedScanPairMap, args: list, depth: int) -> list:
    identity, xs, consts, others = _split_args(prim, args)
    prefix = numpy_impls.lookup(prim.forward)(prim.forward, identity + xs, depth)
    suffix = numpy_impls.lookup(prim.backward)(prim.backward, identity + xs, depth)
    source = {"prefix": prefix, "suffix": suffix, "other": others}
    operands = [source[role][j] for role, j in prim.roles]
    return numpy_impls.lookup(prim.map)(prim.map, consts + operands, depth)


def _canonical_body(map_prim: Map, roles: tuple, k: int) -> Program:
    """The map body with its inputs in the kernel's order: consts, prefix leaves, suffix leaves, others."""
    nc, body = map_prim.num_consts, map_prim.body
    position = {role: nc + p for p, role in enumerate(roles)}
    others = sorted((r for r in roles if r[0] == "other"), key=lambda r: r[1])
    order = (list(range(nc)) + [position[("prefix", j)] for j in range(k)] + [position[("suffix", j)] for j in range(k)]
             + [position[r] for r in others])
    return reorder_inputs(body, order)


@numba_impls.register(FusedScanPairMap)
def _scan_pair_map(prim: FusedScanPairMap, args: list, depth: int):
    identity, xs, consts, others = _split_args(prim, args)
    if depth:
        return None
    if not worth_compiling(xs[0].shape[0]):
        outs = reference_until_hot(prim, args, depth)
        if outs is not None:
            return outs
    shapes = [v.aval.shape for v in prim.forward.body.inputs[: prim.forward.num_leaves]]
    ident = _identity(identity, shapes)
    if ident is None:
        return None
    combine, carry, why = _scalar_operator(prim.forward)
    if combine is None:
        return decline(prim, why)
    body = prim.kernel_body
    try:
        if carry is not None:  # float32 scans carried in float64 (wide_folds.py): the mapper rounds what it reads
            body = rounding_inputs(body, range(len(consts), len(consts) + 2 * len(shapes)))
        mapper = compile_scalar_program(body)
    except Exception as err:  # noqa: BLE001
        return decline(prim, f"its map does not compile: {type(err).__name__}")
    other_shapes = [v.aval.shape for v in body.inputs[len(body.inputs) - len(others):]]
    scalars = [v for c in consts for v in np.asarray(c).reshape(-1)]
    columns, leaves = _allocate(xs[0].shape[0], list(body.out_avals))
    done = run_kernel(prim, "scan_pair_map", combine, len(ident), ident, _split(xs, shapes, 1), mapper, len(columns),
                      _split(others, other_shapes, 1), scalars, out=columns, carry=carry)
    return None if done is None else leaves()
