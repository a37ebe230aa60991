"""Fusion for the numba backend: a scan with the maps around it becomes one kernel (kernels.cpu.map_scan).

A scan's elements are often made by a map that nothing else reads, and its results read by one map alone:
the generic scan vjp (ad/scan_rules.py) builds the affine maps (J_i^T, J_i^T ybar_i) of a linear recurrence
with a map, scans them, and turns the scan into cotangents with another map. `fuse_map_scans(program)`
replaces such a group by one `FusedMapScan` statement: the kernel makes the elements as it goes, in both of
its passes over the data, and writes only the last map's results. Where that map reads some leaves of the
scan only (the vector part of the recurrence), the final pass computes only the leaves those depend on
(not the s x s matrix products, which only the chunk totals need).

The primitive's numpy implementation runs the statements it replaced, so declining is always possible.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from fold.dce import dce
from fold.inline import inline_program
from fold.ir import Let, Lit, Primitive, Program, Var, use_counts, with_statements_replaced
from fold.primitives import Map, Scan
from fold.recognize import recognize_binary_op
from fold.tracing import trace_body

from ..interpreter import eval_program, numpy_impls
from .codegen import compile_problem, compile_scalar_program
from .lowering import (_allocate, _identity, _split, components_of, decline, numba_impls, reference_until_hot,
                       run_kernel, worth_compiling)
from ..wide_operators import carried_operator, widened_operator
from .wide_folds import rounding_inputs


@dataclass(frozen=True, eq=False)
class FusedMapScan(Primitive):
    """Maps whose results only a scan reads, the scan, and (optionally) the one map that reads the scan's
    results: `region` runs them on arrays (the reference) and returns the last statement's results. Its
    inputs are the statement's arguments."""

    region: Program
    name = "map_scan"
    backend_internal = True
    body_fields = ("region",)
    num_consts = 0  # for the printer: the region is shown with all its inputs as parameters

    @property
    def scan(self) -> Let:
        return next(s for s in self.region.stmts if isinstance(s.prim, Scan))

    @property
    def post(self) -> Let | None:
        last = self.region.stmts[-1]
        return last if isinstance(last.prim, Map) else None

    @property
    def pre(self) -> list[Let]:
        return [s for s in self.region.stmts if s is not self.post and isinstance(s.prim, Map)]

    @cached_property
    def operands(self) -> list[tuple[object, bool]]:
        """What the kernel reads, in order: (atom, whole), whole for a map's captured value (the same for every
        element), else an array of n rows read one row per element."""
        found: list[tuple[object, bool]] = []
        produced = {o for s in self.region.stmts for o in s.outs}

        def add(atom, whole):
            if not (isinstance(atom, Var) and atom in produced) and not any(a is atom and w == whole for a, w in found):
                found.append((atom, whole))

        for stmt in self.region.stmts:
            if isinstance(stmt.prim, Map):
                nc = stmt.prim.num_consts
                for p, atom in enumerate(stmt.args):
                    add(atom, p < nc)
            else:
                for atom in stmt.args[stmt.prim.num_leaves:]:  # its elements (the identity is not read per row)
                    add(atom, False)
        return found

    def _element_avals(self) -> list:
        return [a.aval if whole else a.aval.update(shape=a.aval.shape[1:]) for a, whole in self.operands]

    def _lookup(self, elements: list):
        """read(atom, whole): the element (or whole value) of an operand, among the traced `elements`."""
        def read(atom, whole=False):
            return next(e for (a, w), e in zip(self.operands, elements, strict=True) if a is atom and w == whole)
        return read

    @cached_property
    def mapper(self) -> Program:
        """The operands' elements -> the scan's elements."""
        scan = self.scan

        def fn(*elements):
            read, made = self._lookup(list(elements)), {}
            for stmt in self.pre:
                nc = stmt.prim.num_consts
                operands = [read(a, p < nc) for p, a in enumerate(stmt.args)]
                made.update(zip(stmt.outs, inline_program(stmt.prim.body, operands), strict=True))
            return [made[a] if isinstance(a, Var) and a in made else read(a) for a in scan.args[scan.prim.num_leaves:]]

        return trace_body(fn, self._element_avals(), "map_scan elements").program

    @cached_property
    def finish(self) -> Program | None:
        """(the scan's elements, the operands' elements) -> the results of the map that reads the scan."""
        post, scan = self.post, self.scan
        if post is None:
            return None
        k = scan.prim.num_leaves

        def fn(*flat):
            read = self._lookup(list(flat[k:]))
            scanned = dict(zip(scan.outs, flat[:k], strict=True))
            nc = post.prim.num_consts
            return inline_program(post.prim.body, [scanned[a] if isinstance(a, Var) and a in scanned else read(a, p < nc)
                                                   for p, a in enumerate(post.args)])

        avals = [v.aval for v in scan.prim.body.inputs[:k]] + self._element_avals()
        return dce(trace_body(fn, avals, "map_scan results").program)

    @cached_property
    def live(self) -> list[int] | None:
        """The leaves of the scan the final pass must compute (None: all of them): those the last map reads,
        and the accumulator's leaves that computing them reads, until nothing is added."""
        if self.finish is None:
            return None
        body, k = self.scan.prim.body, self.scan.prim.num_leaves
        carried = body.inputs[k:] if self.scan.prim.reverse else body.inputs[:k]  # the accumulator's side
        read = _read_inputs(self.finish)
        needed = {j for j in range(k) if self.finish.inputs[j] in read}
        while True:
            read = _read_inputs(_restricted(body, sorted(needed)))
            more = {j for j, v in enumerate(carried) if v in read} - needed
            if not more:
                return None if len(needed) == k else sorted(needed)
            needed |= more

    @cached_property
    def step(self) -> Program | None:
        """The operator computing only the `live` leaves."""
        return None if self.live is None else _restricted(self.scan.prim.body, self.live)


def _restricted(body: Program, leaves: list[int]) -> Program:
    """The operator returning only these leaves of its result, with what they do not need removed."""
    return dce(Program(body.inputs, body.stmts, tuple(body.outputs[j] for j in leaves)))


def _read_inputs(program: Program) -> set:
    return {a for s in program.stmts for a in s.args if isinstance(a, Var)} | {a for a in program.outputs if isinstance(a, Var)}


def _count(atoms, var: Var) -> int:
    return sum(a is var for a in atoms)


def _compilable(stmt: Let) -> bool:
    return compile_problem(stmt.prim.body) is None


def _group(scan: Let, producer: dict, uses: Counter, outputs: set) -> tuple[list[Let], Let | None] | None:
    """(maps making the scan's elements, the map reading its results) if the scan joins a kernel with them."""
    prim: Scan = scan.prim
    if prim.num_consts or recognize_binary_op(prim.body, 0) == "add" or compile_problem(prim.body) is not None:
        return None
    xs = scan.args[prim.num_leaves:]
    pre: list[Let] = []
    for x in xs:
        stmt = producer.get(x) if isinstance(x, Var) else None
        if stmt is None or not isinstance(stmt.prim, Map) or any(stmt is s for s in pre):
            continue
        if all(uses[o] == _count(xs, o) and o not in outputs for o in stmt.outs) and _compilable(stmt):
            pre.append(stmt)
    readers = {id(s): s for s in producer.values() if any(a in scan.outs for a in s.args if isinstance(a, Var))}
    post = None
    if len(readers) == 1:
        (reader,) = readers.values()
        if (isinstance(reader.prim, Map) and _compilable(reader) and not any(o in outputs for o in scan.outs)
                and all(uses[o] == _count(reader.args, o) for o in scan.outs)
                and all(a not in scan.outs for a in reader.args[: reader.prim.num_consts])):
            post = reader
    return (pre, post) if pre or post else None


def fuse_map_scans(program: Program) -> Program:
    """`program` with each scan that has maps making its elements or a map reading it, and those maps, as one
    FusedMapScan statement in the place of the group's last statement (top level only; a map joins one group)."""
    uses = use_counts(program)
    outputs = {a for a in program.outputs if isinstance(a, Var)}
    producer = {v: s for s in program.stmts for v in s.outs}
    replaced: dict[int, Let] = {}
    removed: set[int] = set()
    for stmt in program.stmts:
        if not isinstance(stmt.prim, Scan) or id(stmt) in removed:
            continue
        group = _group(stmt, producer, uses, outputs)
        if group is None:
            continue
        pre, post = group
        members = pre + [stmt] + ([post] if post else [])
        if any(id(m) in removed or id(m) in replaced for m in members):
            continue
        last = members[-1]
        replaced[id(last)] = _fused_statement(members, uses, outputs)
        removed |= {id(m) for m in members[:-1]}
    return with_statements_replaced(program, replaced, removed)


def _fused_statement(members: list[Let], uses: Counter, outputs: set) -> Let:
    produced = {o for s in members for o in s.outs}
    inputs = list(dict.fromkeys(a for s in members for a in s.args if isinstance(a, Var) and a not in produced))
    last = members[-1]
    results = tuple(last.outs) if isinstance(last.prim, Map) else tuple(o for o in last.outs if uses[o] or o in outputs)
    region = Program(tuple(inputs), tuple(members), results)
    return Let(results, FusedMapScan(region), tuple(inputs))


@numpy_impls.register(FusedMapScan)
def _reference(prim: FusedMapScan, args: list, depth: int) -> list:
    return eval_program(prim.region, args, depth)


@numba_impls.register(FusedMapScan)
def _fused(prim: FusedMapScan, args: list, depth: int):
    scan = prim.scan
    n = scan.args[-1].aval.shape[0]
    if depth:
        return None
    if not worth_compiling(n):
        outs = reference_until_hot(prim, args, depth)
        if outs is not None:
            return outs
    env = dict(zip(prim.region.inputs, args, strict=True))

    def value(atom):
        return atom.value if isinstance(atom, Lit) else env[atom]

    k = scan.prim.num_leaves
    shapes = [v.aval.shape for v in scan.prim.body.inputs[:k]]
    ident = _identity([value(a) for a in scan.args[:k]], shapes)
    if ident is None:
        return None
    for fused in (prim.mapper, prim.finish):
        problem = None if fused is None else compile_problem(fused)
        if problem is not None:
            return decline(prim, f"its fused maps cannot be compiled: {problem}")
    # float32 leaves carried in float64 (wide_folds.py): the operators widened, `post` rounding what it reads
    combine, carry = carried_operator(scan.prim.body, scan.prim.num_consts, [np.asarray(v).dtype for v in ident])
    step = prim.step
    if carry is not None and step is not None:
        step = widened_operator(step)
        if step is None:  # a step that does not widen: nothing is carried wide
            combine, carry, step = scan.prim.body, None, prim.step
    post = None if prim.finish is None else prim.finish if carry is None else rounding_inputs(prim.finish, range(k))
    programs = {"combine": combine, "mapper": prim.mapper, "post": post, "step": step}
    try:
        functions = {name: None if p is None else compile_scalar_program(p) for name, p in programs.items()}
    except Exception as err:  # noqa: BLE001 - any compile failure: the replaced statements run as they were
        return decline(prim, f"it does not compile: {type(err).__name__}")
    columns = []
    for atom, whole in prim.operands:
        x = np.asarray(value(atom))
        columns += [np.broadcast_to(c, (n,)) for c in x.reshape(-1)] if whole else _split([x], [x.shape[1:]], 1)
    finish = prim.finish
    out_avals = list(finish.out_avals) if finish is not None else [v.aval for v in scan.prim.body.inputs[:k]]
    out, results = _allocate(n, out_avals)
    live = None if prim.live is None else _components(prim.live, shapes)
    done = run_kernel(prim, "map_scan", functions["mapper"], len(columns), functions["combine"], len(ident), ident,
                      columns, scan.prim.exclusive, scan.prim.reverse, post=functions["post"],
                      r=None if finish is None else len(out),
                      step=functions["step"], live=live, out=out, carry=carry)
    if done is None:
        return None
    leaves = results()
    if finish is not None:
        return leaves
    return [leaf for leaf, o in zip(leaves, scan.outs, strict=True) if o in prim.region.outputs]


def _components(leaves: list[int], shapes: list[tuple]) -> tuple[int, ...]:
    """The scalar components of these element leaves (leaf-major, as the kernels see elements)."""
    starts = np.cumsum([0] + [components_of(s) for s in shapes])
    return tuple(c for j in leaves for c in range(int(starts[j]), int(starts[j + 1])))
