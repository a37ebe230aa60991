"""The time Numba spends compiling, told apart from run time: charged to the program this thread is running
(what `fold.jit` reports as compile time), and summed per thread, so that a timing around a statement can
leave out the kernels it compiled on the way."""

from __future__ import annotations

import threading
import time

from numba.core import event


class CompileClock(event.Listener):
    """Registered once: installing a timer per call cost as much as running a small program. Compile events
    nest; only the outermost is timed."""

    def __init__(self) -> None:
        self.local = threading.local()

    def on_start(self, _event) -> None:
        depth = getattr(self.local, "depth", 0)
        if depth == 0:
            self.local.start = time.perf_counter()
        self.local.depth = depth + 1

    def on_end(self, _event) -> None:
        self.local.depth -= 1
        if self.local.depth:
            return
        spent = time.perf_counter() - self.local.start
        self.local.total = getattr(self.local, "total", 0.0) + spent
        program = getattr(self.local, "program", None)
        if program is not None:
            program.compile_seconds += spent


clock = CompileClock()
event.register("numba:compile", clock)


def compile_seconds_so_far() -> float:
    """Seconds this thread has spent in Numba's compiler since the clock was registered."""
    return getattr(clock.local, "total", 0.0)
