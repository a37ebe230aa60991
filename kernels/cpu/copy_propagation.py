"""Numba's copy propagation, with the same results, without deep-copying its tables after every sweep.

Numba's parallel-loop passes run a copy-propagation dataflow (`numba.core.ir_utils.copy_propagate`) over a
kernel's blocks several times per compile, once more for each parallel loop inside. Numba's version
deep-copies the whole table of copies (block -> set of (name, name)) after every sweep to see whether the
sweep changed it, and recomputes a block's assigned names once per copy of the whole kernel when it builds
the table (a factor of the block's own copies more than needed). Both walk Python objects element by
element where set operations in C do the same work. On a loop nest of a few hundred statements this was
most of the compile: a row-wise cross-entropy gradient's four kernels took 104 s to compile under the
profiler, 57 s of it in those two functions (48.7 -> 33.3 s unprofiled with the functions below).

`install()` puts the two functions below in numba's place. They sweep the blocks in numba's order and stop
when a sweep changes nothing, exactly as numba's do, so they return equal tables: the copies are tuples of
names (immutable), and numba never changes a block's set in place once made, so comparing the sets a sweep
makes with the ones it replaced is the comparison numba's deep copies make. They are installed only over
the functions they were written against (a hash of numba's source text): a numba whose copy propagation
reads otherwise keeps its own, as does any numba with FOLD_KEEP_NUMBA_COPY_PROPAGATION=1 set (the
switch benchmarks/bench_compile.py compares with).
"""

from __future__ import annotations

import hashlib
import inspect
import os
from typing import Any

# sha256 of the source text of numba's copy_propagate and init_copy_propagate_data, as of numba 0.68.1
_REPLACED_SOURCES = {
    "copy_propagate": "b607f90ff29db1cef4a6ca4f00481dd308f300e829154053daea3d3066305b62",
    "init_copy_propagate_data": "5cf4a6ab79e0dee0034580443f4e12d5e962e26f31388616bb73193c845918b1",
}


def copy_propagate(blocks: dict, typemap: dict) -> tuple[dict, dict]:
    """The copies that hold on entry to and exit from each block (numba's `copy_propagate`): in_b is the
    intersection of the predecessors' out sets, out_b = gen_b | (in_b - kill_b), to a fixed point."""
    from numba.core import ir_utils

    cfg = ir_utils.compute_cfg_from_blocks(blocks)
    entry = cfg.entry_point()
    gen_copies, _, kill_copies, in_copies, out_copies = ir_utils.init_copy_propagate_data(blocks, entry, typemap)
    predecessors = {label: [p for p, _ in cfg.predecessors(label)] for label in blocks if label != entry}
    changed = True
    while changed:
        changed = False
        for label, preds in predecessors.items():
            incoming = out_copies[preds[0]].copy()
            for p in preds:
                incoming &= out_copies[p]
            in_copies[label] = incoming
            out = gen_copies[label] | (incoming - kill_copies[label])
            changed = changed or out != out_copies[label]
            out_copies[label] = out
    return in_copies, out_copies


def init_copy_propagate_data(blocks: dict, entry: Any, typemap: dict) -> tuple:
    """The dataflow's starting point (numba's `init_copy_propagate_data`): each block's own copies (gen), the
    kernel's copies, those each block kills (one it may overwrite, or one of a name the block assigns that
    the block does not itself make), every block but the entry starting from all copies."""
    from numba.core import ir_utils

    gen_copies, extra_kill = ir_utils.get_block_copies(blocks, typemap)
    all_copies: set = set()
    for found in gen_copies.values():
        all_copies |= found
    kill_copies = {}
    for label, gen_set in gen_copies.items():
        killed = extra_kill[label]
        assigned = {lhs for lhs, _ in gen_set}
        kill_copies[label] = {
            (lhs, rhs) for lhs, rhs in all_copies
            if lhs in killed or rhs in killed or ((lhs, rhs) not in gen_set and (lhs in assigned or rhs in assigned))}
    in_copies = {label: all_copies.copy() for label in blocks}
    in_copies[entry] = set()
    out_copies = {label: gen_copies[label] | (in_copies[label] - kill_copies[label]) for label in blocks}
    out_copies[entry] = gen_copies[entry]
    return gen_copies, all_copies, kill_copies, in_copies, out_copies


def source_digest(function: Any) -> str:
    """sha256 of a function's source text, or "" where it cannot be read."""
    try:
        return hashlib.sha256(inspect.getsource(function).encode()).hexdigest()
    except (OSError, TypeError):
        return ""


# numba's own functions, once install() has replaced them (the tests compare the two)
replaced: dict[str, Any] = {}


def install() -> bool:
    """Put the functions above in numba's place (numba.core.ir_utils, and numba.parfors.parfor, which imports
    copy_propagate by name), if numba's are the ones they were written against; whether they are in place."""
    if os.environ.get("FOLD_KEEP_NUMBA_COPY_PROPAGATION") == "1":
        return False
    from numba.core import ir_utils
    from numba.parfors import parfor

    ours = {"copy_propagate": copy_propagate, "init_copy_propagate_data": init_copy_propagate_data}
    current = {name: getattr(ir_utils, name, None) for name in ours}
    if all(current[name] is ours[name] for name in ours):
        return True
    if any(source_digest(current[name]) != _REPLACED_SOURCES[name] for name in ours):
        return False
    replaced.update(current)
    for name, function in ours.items():
        setattr(ir_utils, name, function)
    if getattr(parfor, "copy_propagate", None) is current["copy_propagate"]:
        parfor.copy_propagate = copy_propagate
    return True
