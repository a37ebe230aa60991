"""jvp and vjp of sequential loops, with checkpointing.

Reverse mode must run a loop backwards, so it needs the state before each iteration. The one policy here
(`_stride`): without `checkpoint`, the forward sweep saves every state; with `checkpoint=k` it saves every
k-th, and the return sweep recomputes the k states of one stretch at a time from its checkpoint (strip-mining):
O(n/k + k) states live instead of n, for one extra forward pass.
"""

from __future__ import annotations

import numpy as np

from fold import ops
from fold.combinators import loop as fold_loop
from fold.inline import inline_program
from fold.primitives import Loop, LoopSaving
from fold.tracing import bind, trace_body

from .fn_vjp import vjp_of_function
from .jvp import jvp_inline, jvp_rules
from .map_rules import split_by_mask
from .vjp import arg_activity, vjp_forward_rules, vjp_rules
from .zeros import Zero, aval_of, differentiable, instantiate, is_zero


def _stride(prim: Loop) -> int:
    return prim.checkpoint or 1


def _lifted_body(prim, const_mask: list[bool]):
    """The loop body on (state, tangent) pairs. Inputs: consts, masked const tangents, i, state, state tangents."""
    body, nc = prim.body, prim.num_consts
    const_avals = list(body.in_avals[:nc])
    state_avals = list(body.in_avals[nc + 1:])
    floats = [differentiable(a) for a in state_avals]
    n_ct, n_state, n_t = sum(const_mask), len(state_avals), sum(floats)

    def fn(*flat):
        flat = list(flat)
        consts, flat = flat[:nc], flat[nc:]
        const_t, flat = flat[:n_ct], flat[n_ct:]
        i, state, tstate = flat[0], flat[1: 1 + n_state], flat[1 + n_state:]
        ct_iter, t_iter = iter(const_t), iter(tstate)
        tangents = ([next(ct_iter) if m else Zero(a) for m, a in zip(const_mask, const_avals, strict=True)] + [Zero(aval_of(i))]
                    + [next(t_iter) if f else Zero(a) for f, a in zip(floats, state_avals, strict=True)])
        outs, touts = jvp_inline(body, consts + [i] + state, tangents)
        return list(outs) + [instantiate(t, a) for t, a, f in zip(touts, state_avals, floats, strict=True) if f]

    avals = (const_avals + [a for m, a in zip(const_mask, const_avals, strict=True) if m] + [body.in_avals[nc]]
             + state_avals + [a for a, f in zip(state_avals, floats, strict=True) if f])
    traced = trace_body(fn, avals, "lifted loop body")
    return traced.program, floats, n_t


def _loop_like_jvp(prim, primals, tangents):
    nc = prim.num_consts
    consts, state = primals[:nc], primals[nc:]
    const_mask = [not is_zero(t) for t in tangents[:nc]]
    body, floats, n_t = _lifted_body(prim, const_mask)
    tstate = [instantiate(t, aval_of(s)) for t, s, f in zip(tangents[nc:], state, floats, strict=True) if f]
    lifted = type(prim)(**{**{f: getattr(prim, f) for f in prim.__dataclass_fields__}, "body": body, "num_consts": nc + sum(const_mask)})
    outs = bind(lifted, *consts, *[t for t in tangents[:nc] if not is_zero(t)], *state, *tstate)
    n_state = len(state)
    groups = [outs[:n_state], outs[n_state: n_state + n_t]]
    if isinstance(prim, LoopSaving):  # then the saved stacks: states, then tangents
        rest = outs[n_state + n_t:]
        groups += [rest[:n_state], rest[n_state:]]
    primal_out, tangent_out = list(groups[0]), split_by_mask(groups[1], floats, [aval_of(x) for x in groups[0]])
    if isinstance(prim, LoopSaving):
        primal_out += list(groups[2])
        tangent_out += split_by_mask(groups[3], floats, [aval_of(x) for x in groups[2]])
    return primal_out, tangent_out


jvp_rules.register(Loop, LoopSaving)(_loop_like_jvp)


@vjp_forward_rules.register(Loop)
def _loop_forward(prim: Loop, args):
    """Run the loop saving every `_stride`-th state: the checkpoints of the return sweep."""
    outs = bind(LoopSaving(prim.body, prim.num_consts, prim.n, _stride(prim)), *args)
    k = len(args) - prim.num_consts
    return outs[:k], outs[k:]


def _step_vjp(prim, consts, active_consts, i, state, ct_state, ct_consts):
    """One iteration backwards: cotangents of (consts, state) of `state = body(i, state)`; of the consts,
    only those marked in `active_consts` are wanted."""
    nc = prim.num_consts
    cts = vjp_of_function(lambda *cs: inline_program(prim.body, list(cs[:nc]) + [i] + list(cs[nc:])),
                          list(consts) + list(state), ct_state, list(active_consts) + [True] * len(state))
    new_consts = [ops.convert(a + instantiate(c, aval_of(a)), aval_of(a).dtype) for a, c in zip(ct_consts, cts[:nc], strict=True)]
    new_state = [instantiate(c, aval_of(s)) for c, s in zip(cts[nc:], state, strict=True)]
    return new_state, new_consts


def _backward_stretch(prim, consts, active_consts, start: int, length, first_state, ct_state, ct_consts, saved_cts=None):
    """The return sweep over iterations start .. start+length-1, recomputing their states from `first_state`.

    `start` may be traced (the stretch index of an enclosing loop); `length` is static. `saved_cts`: see
    `_add_saved_cts`.
    """
    nc = prim.num_consts
    k = len(first_state)
    if length == 1:
        finals, stacks = list(first_state), None
    else:  # the states before iterations 0 .. length-2 are saved; the last one is the loop's final state
        saving = LoopSaving(_offset_body(prim), nc + 1, length - 1, 1)
        outs = bind(saving, *consts, ops.convert(start, "int64"), *first_state)
        finals, stacks = outs[:k], outs[k:]

    def state_before(i_local):
        """The state before local iteration i_local: the last one is `finals` (not copied onto the stack)."""
        if stacks is None:
            return finals
        row = ops.minimum(i_local, length - 2)
        return [ops.where(i_local == length - 1, final, stack[row]) for final, stack in zip(finals, stacks, strict=True)]

    def back(j, carry):
        ct_s, ct_c = carry
        i_local = length - 1 - j
        state_i = state_before(i_local)
        new_s, new_c = _step_vjp(prim, consts, active_consts, start + i_local, state_i, list(ct_s), list(ct_c))
        return _add_saved_cts(new_s, saved_cts, start + i_local), new_c

    if length == 1:  # one step: written in place, not as a loop of one iteration the backend runs apart
        return back(0, (list(ct_state), list(ct_consts)))
    ct_s, ct_c = fold_loop(back, (list(ct_state), list(ct_consts)), length)
    return list(ct_s), list(ct_c)


def _offset_body(prim):
    """The body with its counter shifted by an extra leading const: body'(consts, offset, i, s) = body(consts, offset + i, s)."""
    nc = prim.num_consts
    avals = list(prim.body.in_avals[:nc]) + [aval_of(np.int64(0))] + list(prim.body.in_avals[nc:])

    def fn(*flat):
        consts, offset, i, state = flat[:nc], flat[nc], flat[nc + 1], flat[nc + 2:]
        return inline_program(prim.body, list(consts) + [offset + i] + list(state))

    return trace_body(fn, avals, "loop body (offset)").program


def _add_saved_cts(ct_state, saved_cts, i):
    """Add the cotangent of the state before iteration `i` as a LoopSaving output (row i // stride of its
    stacks, when i % stride == 0), if the stacks have cotangents: `saved_cts` is (stride, per-leaf cts or Zero)."""
    if saved_cts is None:
        return ct_state
    stride, stack_cts = saved_cts
    hit = (i % stride) == 0
    return [c if is_zero(sc) else c + ops.where(hit, sc[i // stride], 0.0).astype(aval_of(c).dtype)
            for c, sc in zip(ct_state, stack_cts, strict=True)]


@vjp_rules.register(Loop)
def _loop_vjp(prim: Loop, args, outs, saved, cts, saved_cts=None):
    nc = prim.num_consts
    consts = args[:nc]
    ct_state = [instantiate(c, aval_of(o)) for c, o in zip(cts, outs, strict=True)]
    active = arg_activity(len(args))
    diff_consts = [i for i, c in enumerate(consts) if active[i] and hasattr(c, "aval") and differentiable(c.aval)]
    active_consts = [i in diff_consts for i in range(nc)]
    ct_consts = [ops.broadcast_to(np.zeros((), aval_of(consts[i]).dtype), aval_of(consts[i]).shape) for i in diff_consts]
    const_list = list(consts)
    stride, n = _stride(prim), prim.n
    if n == 0:
        return [Zero(aval_of(a)) for a in consts] + ct_state
    all_ct_consts = _full_const_cts(consts, diff_consts, ct_consts)
    n_full, rest = divmod(n, stride)
    if rest:  # the last, shorter stretch first
        last = [s[n_full] for s in saved]
        ct_state, all_ct_consts = _backward_stretch(prim, const_list, active_consts, n_full * stride, rest, last, ct_state, all_ct_consts, saved_cts)
    if n_full:
        def back_stretch(j, carry):
            ct_s, ct_c = carry
            seg = n_full - 1 - j
            first = [s[seg] for s in saved]
            return _backward_stretch(prim, const_list, active_consts, seg * stride, stride, first, list(ct_s), list(ct_c), saved_cts)

        if n_full == 1:
            ct_state, all_ct_consts = _backward_stretch(prim, const_list, active_consts, 0, stride, [s[0] for s in saved], ct_state, all_ct_consts,
                                                        saved_cts)
        else:
            ct_state, all_ct_consts = fold_loop(back_stretch, (list(ct_state), list(all_ct_consts)), n_full)
            ct_state, all_ct_consts = list(ct_state), list(all_ct_consts)
    const_cts = [all_ct_consts[i] if i in diff_consts else Zero(aval_of(c)) for i, c in enumerate(consts)]
    return const_cts + list(ct_state)


def _full_const_cts(consts, diff_consts, ct_consts):
    """An accumulator per const (zeros; a non-float const's accumulator stays a 0-d placeholder)."""
    out, it = [], iter(ct_consts)
    for i, c in enumerate(consts):
        out.append(next(it) if i in diff_consts else np.zeros((), np.float64))
    return out


@vjp_rules.register(LoopSaving)
def _loop_saving_vjp(prim: LoopSaving, args, outs, residual, cts):
    """Only reached when a gradient program is itself differentiated. As for a Loop, plus: the saved stacks
    are outputs too (the states before iterations 0, stride, ...), so their cotangents join those states'."""
    nc = prim.num_consts
    k = len(args) - nc
    loop = Loop(prim.body, nc, prim.n, None)
    stack_cts = [c if is_zero(c) else instantiate(c, aval_of(o)) for c, o in zip(cts[k:], outs[k:], strict=True)]
    saved_cts = None if all(is_zero(c) for c in stack_cts) else (prim.stride, stack_cts)
    all_states = outs[k:] if prim.stride == 1 else bind(LoopSaving(prim.body, nc, prim.n, 1), *args)[k:]
    return _loop_vjp(loop, args, outs[:k], all_states, cts[:k], saved_cts)
