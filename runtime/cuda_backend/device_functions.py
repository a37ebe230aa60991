"""Lambdas (reduce and scan operators, map bodies) as CUDA device functions of their scalars.

The text is the numba backend's (runtime.numba_backend.codegen.program_source: every value of a small
static shape written as its scalars, nested combinators unrolled), compiled with numba.cuda.jit(device=True)
against device_helpers instead of the CPU helpers. Memoised per Program.
"""

from __future__ import annotations

import itertools
import linecache
import weakref
from typing import Callable

from fold.ir import Program
from fold.runtime.numba_backend.codegen import compile_problem, program_source

from . import device_helpers

_compiled: "weakref.WeakKeyDictionary[Program, tuple[Callable | None, str | None]]" = weakref.WeakKeyDictionary()
_SERIAL = itertools.count()


def device_function(program: Program) -> tuple[Callable | None, str | None]:
    """(the program as a device function of its inputs' scalars, returning its outputs' scalars: one alone,
    else a tuple; None) or (None, why it cannot be written so)."""
    found = _compiled.get(program)
    if found is None:
        found = _compiled[program] = _compile(program)
    return found


def _compile(program: Program) -> tuple[Callable | None, str | None]:
    problem = compile_problem(program)
    if problem is not None:
        return None, problem
    source = program_source(program, "scalar_fn")
    from numba import cuda

    text = "import math\nimport numpy as np\n\n" + source + "\n"
    filename = f"<cuda device function #{next(_SERIAL)}>"
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    namespace = {name: getattr(device_helpers, name) for name in device_helpers.HELPERS}
    exec(compile(text, filename, "exec"), namespace)
    return cuda.jit(device=True)(namespace["scalar_fn"]), None
