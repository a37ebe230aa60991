"""What a call says while it compiles: first calls on a fresh kernel cache take seconds (Numba compiling the
kernels the program needs), and silence looks like a hang.

Every kernel compiled is logged on the logger "fold" (DEBUG, with its time); once a call has been compiling for
`NOTICE_AFTER_SECONDS` it says so at INFO, and again when it finishes (how many kernels, how long). When
stderr is a terminal a status line there shows the same, rewritten in place (carriage return), unless
FOLD_PROGRESS=0. Backend-neutral: a backend reports `kernel_started` / `kernel_compiled` to the call's
`CompileFeedback`; the numba backend does it from its compile clock.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time

logger = logging.getLogger("fold")

NOTICE_AFTER_SECONDS = 1.0


def _progress_line_wanted() -> bool:
    """A status line on stderr: only on a terminal (a log file or a pipe gets the log records alone)."""
    if os.environ.get("FOLD_PROGRESS", "1") == "0":
        return False
    stream = sys.stderr
    return stream is not None and hasattr(stream, "isatty") and stream.isatty()


class CompileFeedback:
    """The compile feedback of one call of a compiled program (`label` names it: the jitted function)."""

    def __init__(self, label: str):
        self.label = label
        self.kernels = 0
        self.seconds = 0.0
        self.current: str | None = None
        self.started = time.perf_counter()
        self.noticed = False
        self.line = _progress_line_wanted()
        self._lock = threading.Lock()
        self._timer = threading.Timer(NOTICE_AFTER_SECONDS, self._notice)
        self._timer.daemon = True
        self._timer.start()

    def kernel_started(self, name: str) -> None:
        with self._lock:
            self.current = name
            if self.noticed:
                self._status()

    def kernel_compiled(self, name: str, seconds: float) -> None:
        with self._lock:
            self.kernels += 1
            self.seconds += seconds
            self.current = None
            logger.debug("fold: compiled kernel %s for %s in %.2f s (%d this call)", name, self.label, seconds,
                         self.kernels)
            if self.noticed:
                self._status()

    def finish(self) -> None:
        """The call is over: stop the timer; if it said it was compiling, say what it compiled."""
        self._timer.cancel()
        with self._lock:
            if not self.noticed:
                return
            elapsed = time.perf_counter() - self.started
            message = (f"fold: compiled {self.kernels} kernel{'s' if self.kernels != 1 else ''} for {self.label} "
                       f"in {self.seconds:.1f} s (first call for these shapes and dtypes; {elapsed:.1f} s in all)")
            logger.info(message)
            if self.line:
                sys.stderr.write("\r" + message.ljust(100) + "\n")
                sys.stderr.flush()

    def _notice(self) -> None:
        with self._lock:
            self.noticed = True
            logger.info("fold: compiling kernels for %s (%d compiled so far%s); later calls reuse them",
                        self.label, self.kernels, f", now {self.current}" if self.current else "")
            self._status()

    def _status(self) -> None:
        if not self.line:
            return
        now = f", now {self.current}" if self.current else ""
        text = (f"fold: compiling kernels for {self.label}: {self.kernels} compiled{now}, "
                f"{time.perf_counter() - self.started:.1f} s")
        sys.stderr.write("\r" + text[:100].ljust(100))
        sys.stderr.flush()
