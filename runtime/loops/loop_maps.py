"""A fold.loop whose body works element by element on its states, written as a map of a loop over scalars.

`fold.loop(lambda i, acc: acc * x + c[i], zeros, k)` (Horner's rule for every element of x) runs k steps, each a
pass over arrays of n elements: a kernel per step, and its states written and read back k times. Each element's
states only ever meet the same element of the other states and of the arrays the body captures, so the loop is
also a map over the elements of a loop over scalars: `map(lambda x_e, acc_e: loop(lambda i, a: a * x_e + c[i],
acc_e, k), x, zeros)`, which the loop nest runs as one pass, each element's k steps in registers (loop
interchange, as Futhark's `map`/`loop` interchange and a compiler's loop nest would do it).

`loops_as_maps(program)` rewrites a top-level loop so where:

- its states are vectors of one length n (a "row" value is a vector of n made from them element by element);
- each statement of its body that reads a row value is elementwise (an operation, a conversion), reading row
  values, scalars, and vectors made by broadcasting a scalar (a coefficient c[i] of the step);
- the statements that read no row value (c[i]: a gather of a captured array at the counter) make no vector of
  n but by broadcasting a scalar: they are computed the same for every element, inside the map;
- a captured vector of n is read only by elementwise statements (x above: the map reads its element), a
  captured stack of k such vectors (the states a forward loop saved, read by a gradient's reverse loop) only
  at one row per step (stack[k - 1 - i]: the map reads the element's entry of that row, by its index), and
  the body returns row values or broadcast scalars.

A loop whose vector states meet only in sums read by its other states splits in two (`_split_at_sums`, loop
distribution): the reverse loop of Horner's gradient carries the elements' cotangents z (z <- z * x) and the
coefficients' cotangent w, which gains the sum of z at each step (w[k - 1 - i] += sum(z)). The elements' part
is a map over them of a loop over scalars that saves each step's state and returns every step's summed value
(a row of k per element); the loop nest sums those rows over the elements as it maps them (a (k,) state),
and a loop over w alone reads step i's sum. Nothing of the elements' size is written per step.

The fusion pass keeps the rewrite only where the map becomes a loop nest (fusion.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from fold.dce import dce, with_producers
from fold.ir import Let, Program, Var, depends_on
from fold.pytree import tree_flatten
from fold.primitives import (BroadcastTo, Convert, Elementwise, Gather, Iota, Loop, LoopSaving, Map, StopGradient,
                             SumAxes)

ELEMENTWISE = (Elementwise, Convert, StopGradient)


def loops_as_maps(program: Program) -> tuple[Program, set[Var]]:
    """`program` with each loop that qualifies written as a map of a loop over scalars (the module's
    docstring), and the results of the maps it wrote. A loop reading the states a forward loop saved first
    runs that forward loop for its element, where it can (`_forward_stacks`); the forward loop, its stacks
    then unread, is a plain loop, written as a map in turn."""
    forwards = _forward_stacks(program)
    maps: set[Var] = set()
    if forwards:
        program, maps = _rewritten(program, forwards)
        program = dce(program) if maps else program
    program, more = _rewritten(program)
    return program, maps | more


def _rewritten(program: Program, forwards: dict | None = None) -> tuple[Program, set[Var]]:
    """`program` with each loop that `_as_map` or `_split_at_sums` writes as a map so written (given
    `forwards`, only the loops reading their stacks), and the results of the maps written."""
    stmts, maps = [], set()
    for stmt in program.stmts:
        wanted = isinstance(stmt.prim, Loop) and (forwards is None or any(a in forwards for a in stmt.args))
        made = (_as_map(stmt, forwards=forwards) or _split_at_sums(stmt, forwards)) if wanted else None
        stmts += made or [stmt]
        if made is not None:
            maps.update(v for s in made if isinstance(s.prim, Map) for v in s.outs)
    if not maps:
        return program, maps
    return Program(program.inputs, tuple(stmts), program.outputs, program.in_tree, program.out_tree,
                   dict(program.meta)), maps


@dataclass(frozen=True)
class _Forward:
    """A forward loop that saves its states (a LoopSaving over vectors), written as a map of a loop over
    scalars that saves each element's states: `saving` computes them in a map body from `inputs` (the
    captured values, then the element's), which the map reads from `captured` and `per_element`."""

    saving: Let
    inputs: tuple[Var, ...]
    captured: tuple
    per_element: tuple
    saved: tuple[Var, ...]  # each state's saved values, `saving`'s last outputs

    def fresh(self) -> "_Forward":
        """The same with variables of its own (for one more map body)."""
        inputs = tuple(Var(v.aval) for v in self.inputs)
        rename = dict(zip(self.inputs, inputs, strict=True))
        outs = tuple(Var(v.aval) for v in self.saving.outs)
        saving = Let(outs, self.saving.prim, tuple(rename.get(a, a) for a in self.saving.args))
        return _Forward(saving, inputs, self.captured, self.per_element, outs[len(outs) - len(self.saved):])


def _forward_stacks(program: Program) -> dict[Var, tuple[_Forward, int]]:
    """Each stack of saved states made by a forward loop over vectors whose steps are a loop over scalars for
    each element (`_as_map`): the stack -> (that loop per element, which of its states)."""
    found: dict[Var, tuple[_Forward, int]] = {}
    for stmt in program.stmts:
        prim = stmt.prim
        if not isinstance(prim, LoopSaving) or prim.stride != 1:
            continue
        k = len(prim.body.outputs)
        made = _as_map(Let(stmt.outs[:k], Loop(prim.body, prim.num_consts, prim.n), stmt.args))
        if made is None or len(made) != 1:  # a forward loop reading stacks of its own is left as it is
            continue
        (mapped,) = made
        body, ncap = mapped.prim.body, mapped.prim.num_consts
        (looped,) = body.stmts
        saved = tuple(Var(r.aval.update(shape=(prim.n,))) for r in looped.outs)
        saving = Let(looped.outs + saved, LoopSaving(looped.prim.body, looped.prim.num_consts, prim.n, 1),
                     looped.args)
        forward = _Forward(saving, body.inputs, mapped.args[:ncap], mapped.args[ncap:], saved)
        found.update({stack: (forward, j) for j, stack in enumerate(stmt.outs[k:])})
    return found


def _as_map(stmt: Let, summed: Sequence[Var] = (), forwards: dict | None = None) -> list[Let] | None:
    """The statements computing the loop as a map (an iota of the elements' indices first, where the body
    reads a stack at the step), or None where the loop does not qualify. `summed`: row values of the body
    whose every step's value the map also returns, as one (n, steps) result each after the loop's states
    (the loop then saves its states, and a map over the steps computes each value again from them).
    `forwards` (`_forward_stacks`): a stack the body reads that one of these makes is computed again for each
    element, by that forward loop over the element's scalars, in the map's body, instead of read whole."""
    prim: Loop = stmt.prim
    nc = prim.num_consts
    consts, init = stmt.args[:nc], stmt.args[nc:]
    shapes = {getattr(a, "aval", None) and a.aval.shape for a in init}
    if not init or len(shapes) != 1:
        return None
    (shape,) = shapes
    if len(shape) != 1 or shape[0] < 2:
        return None
    body = prim.body
    body_consts, counter, states = body.inputs[:nc], body.inputs[nc], body.inputs[nc + 1:]
    # a captured vector of n is read element by element (a row); a captured stack of such vectors (k, n), the
    # states a forward loop saved, is read at one row per step (a column per element); anything else whole
    by_row = {v for v, a in zip(body_consts, consts, strict=True) if a.aval.shape == shape}
    stacks = {v for v, a in zip(body_consts, consts, strict=True)
              if isinstance(a, Var) and a.aval.ndim == 2 and a.aval.shape[1:] == shape}
    # a stack computed again per element: the body const -> (the forward loop, which state's stack)
    known = forwards or {}
    again_per_element = {v: known[a] for v, a in zip(body_consts, consts, strict=True) if v in stacks and a in known}
    if forwards is not None and not again_per_element:
        return None
    stacks -= set(again_per_element)
    rows = set(by_row) | set(states)
    splats: dict[Var, object] = {}  # a vector of n made by broadcasting a scalar -> that scalar
    stack_reads: set[int] = set()  # the gathers of a stack's row at a step's scalar index
    for s in body.stmts:
        if any(isinstance(a, Var) and (a in stacks or a in again_per_element) for a in s.args):
            if not (isinstance(s.prim, Gather) and (s.args[0] in stacks or s.args[0] in again_per_element)
                    and s.args[1] not in stacks and s.args[1] not in again_per_element
                    and s.args[1].aval.shape == () and not (isinstance(s.args[1], Var) and s.args[1] in rows)):
                return None
            stack_reads.add(id(s))
            rows.add(s.outs[0])
            continue
        reads_rows = any(isinstance(a, Var) and a in rows for a in s.args)
        if not reads_rows:
            if isinstance(s.prim, BroadcastTo) and s.args[0].aval.shape == () and s.outs[0].aval.shape == shape:
                splats[s.outs[0]] = s.args[0]
            elif any(o.aval.shape == shape for o in s.outs):
                return None  # a vector of n the same for every step but not for every element (an iota)
            continue
        if not isinstance(s.prim, ELEMENTWISE) or len(s.outs) != 1 or s.outs[0].aval.shape != shape:
            return None
        if not all((isinstance(a, Var) and (a in rows or a in splats)) or a.aval.shape == () for a in s.args):
            return None
        rows.add(s.outs[0])
    if not all(isinstance(o, Var) and (o in rows or o in splats) for o in body.outputs):
        return None
    scalar = {v: Var(v.aval.update(shape=())) for v in rows}

    def arg(a):
        if isinstance(a, Var) and a in scalar:
            return scalar[a]
        if isinstance(a, Var) and a in splats:
            return arg(splats[a])
        return a

    whole = [v for v in body_consts if v not in by_row]
    element = Var(counter.aval) if stacks else None  # the element's index, for a stack's column
    # a stack computed for the element is its column: the element's saved states, one per step
    column = {v: Var(v.aval.update(shape=v.aval.shape[:1])) for v in again_per_element}
    inner_stmts = []
    for s in body.stmts:
        if id(s) in stack_reads and s.args[0] in column:  # the element's saved state at the step
            inner_stmts.append(Let((scalar[s.outs[0]],), Gather(), (column[s.args[0]], s.args[1])))
        elif id(s) in stack_reads:  # stack[k][e]: the step's row, then the element's entry of it
            stack_row = Var(s.outs[0].aval)
            inner_stmts += [Let((stack_row,), s.prim, s.args), Let((scalar[s.outs[0]],), Gather(), (stack_row, element))]
        elif any(isinstance(a, Var) and a in rows for a in s.args):
            inner_stmts.append(Let((scalar[s.outs[0]],), s.prim, tuple(arg(a) for a in s.args)))
        else:  # the same for every element (a broadcast scalar read by a row is read as the scalar: dce drops it)
            inner_stmts.append(s)
    step_inputs = (*(column.get(v, v) for v in whole), *(scalar[v] for v in body_consts if v in by_row),
                   *([element] if stacks else []), counter, *(scalar[v] for v in states))
    step = dce(Program(step_inputs, tuple(inner_stmts), tuple(arg(o) for o in body.outputs), _tree(len(step_inputs)),
                       body.out_tree))
    # the map's body: the captured values read whole, then the element of each captured row and initial state
    outer_whole = [a for v, a in zip(body_consts, consts, strict=True) if v not in by_row]
    outer_rows = [a for v, a in zip(body_consts, consts, strict=True) if v in by_row]
    indices = [Var(counter.aval.update(shape=shape))] if stacks else []  # the elements' indices: an iota
    whole_in = [Var(a.aval) if isinstance(a, Var) else a for a in outer_whole]
    element_in = [Var(a.aval.update(shape=())) for a in (*outer_rows, *indices, *init)]
    # the forward loops run again for the element, each once, before the loop reads their saved states
    forward_runs = {id(f): f.fresh() for f, _ in again_per_element.values()}
    step_whole = [forward_runs[id(again_per_element[v][0])].saved[again_per_element[v][1]] if v in column else w
                  for v, w in zip(whole, whole_in, strict=True)]
    results = tuple(Var(v.aval.update(shape=())) for v in states)
    step_consts = len(whole) + len(outer_rows) + len(indices)
    if summed and not all(isinstance(v, Var) and v in rows for v in summed):
        return None
    first = tuple(f.saving for f in forward_runs.values())
    if summed:  # the states before each step, and each summed value computed again from them at every step
        saved = tuple(Var(v.aval.update(shape=(prim.n,))) for v in states)
        looped = Let(results + saved, LoopSaving(step, step_consts, prim.n, 1), (*step_whole, *element_in))
        again = dce(Program(step_inputs, tuple(inner_stmts), tuple(scalar[v] for v in summed),
                            _tree(len(step_inputs))))
        steps = Var(counter.aval.update(shape=(prim.n,)))
        per_step = tuple(Var(v.aval.update(shape=(prim.n,))) for v in summed)
        body_stmts = (*first, looped, Let((steps,), Iota(prim.n, counter.aval.dtype), ()),
                      Let(per_step, Map(again, step_consts), (*step_whole, *element_in[:step_consts - len(whole)],
                                                               steps, *saved)))
    else:
        per_step, body_stmts = (), (*first, Let(results, Loop(step, step_consts, prim.n, prim.checkpoint),
                                                (*step_whole, *element_in)))
    # a literal read whole (an array the function closes over) stays in the body, read by its loop
    kept_whole = [(v, a) for v, a, w in zip(whole_in, outer_whole, whole, strict=True) if w not in column]
    captured = [a for _, a in kept_whole if isinstance(a, Var)]
    runs = list(forward_runs.values())
    run_captured = [n for f in runs for n, a in zip(f.inputs, f.captured)]
    run_elements = [n for f in runs for n in f.inputs[len(f.captured):]]
    inputs = (*[v for v, _ in kept_whole if isinstance(v, Var)], *run_captured, *element_in, *run_elements)
    map_body = Program(inputs, body_stmts, results + per_step, _tree(len(inputs)))
    outs = stmt.outs + tuple(Var(v.aval.update(shape=shape + (prim.n,))) for v in summed)
    made = Let(outs, Map(map_body, len(captured) + len(run_captured)),
               (*captured, *(a for f in runs for a in f.captured), *outer_rows, *indices, *init,
                *(a for f in runs for a in f.per_element)))
    return [Let(tuple(indices), Iota(shape[0], counter.aval.dtype), ()), made] if stacks else [made]


def _split_at_sums(stmt: Let, forwards: dict | None = None) -> list[Let] | None:
    """The loop as two, where its states of n elements never read its other states, and those read the
    elements only through sums over them (a loop's gradient: the cotangent of a coefficient c[i] gains the
    sum of the elements' cotangents at each step): a map over the elements of a loop over scalars that also
    returns each summed value at every step, their sums over the elements (the loop nest folds them as the
    map runs), and a loop over the other states reading step i's sums. None where the loop does not split so
    or its part over the elements is not a map (`_as_map`, given `forwards`)."""
    prim: Loop = stmt.prim
    nc, body = prim.num_consts, stmt.prim.body
    counter, states = body.inputs[nc], body.inputs[nc + 1:]
    sums = [s for s in body.stmts if isinstance(s.prim, SumAxes) and tuple(s.prim.axes) == (0,)
            and s.args[0].aval.ndim == 1 and isinstance(s.args[0], Var)]
    lengths = {s.args[0].aval.shape for s in sums}
    if len(lengths) != 1:
        return None
    (shape,) = lengths
    rows = [k for k, v in enumerate(states) if v.aval.shape == shape]
    others = [k for k in range(len(states)) if k not in rows]
    if not rows or not others:
        return None
    row_out = [body.outputs[k] for k in rows]
    other_out = [body.outputs[k] for k in others]
    summed_args = [s.args[0] for s in sums]
    summing_ids = {id(s) for s in sums}
    apart = [s for s in body.stmts if id(s) not in summing_ids]  # the sums' results taken as given
    row_part = _computing(body.stmts, row_out + summed_args)
    other_part = _computing(apart, other_out)
    other_states = {states[k] for k in others}
    row_states = {states[k] for k in rows} | {v for v in body.inputs[:nc] if v.aval.shape[-1:] == shape}
    if (_reads(row_part, other_states) or _reads(other_part, depends_on(apart, row_states))
            or any(isinstance(o, Var) and o in other_states for o in row_out)
            or any(isinstance(o, Var) and o in row_states for o in other_out)):
        return None
    consts, init = stmt.args[:nc], stmt.args[nc:]
    row_body = Program((*body.inputs[:nc], counter, *(states[k] for k in rows)), tuple(row_part), tuple(row_out),
                       _tree(nc + 1 + len(rows)))
    row_loop = Let(tuple(stmt.outs[k] for k in rows), Loop(row_body, nc, prim.n, prim.checkpoint),
                   (*consts, *(init[k] for k in rows)))
    made = _as_map(row_loop, summed_args, forwards)
    if made is None:
        return None
    per_step = made[-1].outs[len(rows):]
    totals = [Var(v.aval.update(shape=(prim.n,))) for v in per_step]
    total_inputs = [Var(v.aval) for v in totals]
    at_step = [Let(s.outs, Gather(), (total, counter)) for s, total in zip(sums, total_inputs, strict=True)]
    other_body = Program((*body.inputs[:nc], *total_inputs, counter, *(states[k] for k in others)),
                         (*at_step, *other_part), tuple(other_out),
                         _tree(nc + len(totals) + 1 + len(others)))
    other_loop = Let(tuple(stmt.outs[k] for k in others), Loop(other_body, nc + len(totals), prim.n, prim.checkpoint),
                     (*consts, *totals, *(init[k] for k in others)))
    summing = [Let((t,), SumAxes((0,)), (v,)) for t, v in zip(totals, per_step, strict=True)]
    return [*made, *summing, other_loop]


def _computing(stmts: Sequence[Let], wanted: Sequence) -> list[Let]:
    """The statements among `stmts` that compute `wanted`, in order."""
    produced = {v: s for s in stmts for v in s.outs}
    found = with_producers(stmts, [produced[v] for v in wanted if isinstance(v, Var) and v in produced])
    return [s for s in stmts if id(s) in found]


def _reads(stmts: Sequence[Let], values: set) -> bool:
    return any(isinstance(a, Var) and a in values for s in stmts for a in s.args)


def _tree(count: int):
    return tree_flatten(tuple(range(count)))[1]
