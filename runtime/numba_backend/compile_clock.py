"""The time Numba spends compiling, told apart from run time: charged to the program this thread is running
(what `fold.jit` reports as compile time), and summed per thread, so that a timing around a statement can
leave out the kernels it compiled on the way. Each kernel compiled during a program's call is also reported
to that call's `CompileFeedback` (logged; a status line on a terminal), created at the call's first compile.
A kernel loaded from Numba's disk cache fires no compile event: only real compiles are counted."""

from __future__ import annotations

import threading
import time

from numba.core import event

from ..compile_feedback import CompileFeedback


class CompileClock(event.Listener):
    """Registered once: installing a timer per call cost as much as running a small program. Compile events
    nest; only the outermost is timed."""

    def __init__(self) -> None:
        self.local = threading.local()

    def on_start(self, compile_event) -> None:
        depth = getattr(self.local, "depth", 0)
        if depth == 0:
            self.local.start = time.perf_counter()
            program = getattr(self.local, "program", None)
            if program is not None:
                if getattr(self.local, "feedback", None) is None:
                    self.local.feedback = CompileFeedback(program.label)
                self.local.feedback.kernel_started(_kernel_name(compile_event))
        self.local.depth = depth + 1

    def on_end(self, compile_event) -> None:
        self.local.depth -= 1
        if self.local.depth:
            return
        spent = time.perf_counter() - self.local.start
        self.local.total = getattr(self.local, "total", 0.0) + spent
        program = getattr(self.local, "program", None)
        if program is not None:
            program.compile_seconds += spent
            feedback = getattr(self.local, "feedback", None)
            if feedback is not None:
                feedback.kernel_compiled(_kernel_name(compile_event), spent)


def _kernel_name(compile_event) -> str:
    """The compiled function's name and argument types, from the event Numba sends."""
    data = compile_event.data or {}
    dispatcher = data.get("dispatcher")
    func = getattr(dispatcher, "py_func", None)
    name = getattr(func, "__name__", "kernel")
    args = data.get("args")
    return f"{name}({', '.join(str(a) for a in args)})" if args else name


clock = CompileClock()
event.register("numba:compile", clock)


def compile_seconds_so_far() -> float:
    """Seconds this thread has spent in Numba's compiler since the clock was registered."""
    return getattr(clock.local, "total", 0.0)
