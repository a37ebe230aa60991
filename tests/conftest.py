import os
import sys
import threading

import pytest
from hypothesis import HealthCheck, settings

# check mode (runtime/operator_checks.py) is on in the suite, also where pytest is run without make
os.environ.setdefault("FOLD_CHECK", "1")

# CI draws the same examples every run (derandomize), so a red CI is never a roll of the dice; "dev" explores
settings.register_profile("ci", max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=100, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def _serialise_simulated_shared_arrays() -> None:
    """Numba's CUDA simulator runs a block's threads as Python threads, and the first thread to reach a
    `cuda.shared.array` line allocates the block's array for that line: it looks the line up, allocates,
    then records it, with no lock (numba/cuda/simulator/kernelapi.py, FakeCUDAShared.array). A thread that
    switches in between allocates an array of its own, its partials never meet the block's, and a correct
    kernel gives garbage now and then (the segmented scan test failed so once in a full run). The same
    lookup under a lock."""
    from numba.cuda.simulator import kernelapi
    from numba.np import numpy_support

    lock, dynamic = threading.Lock(), kernelapi.FakeCUDAShared.array

    def array(self, shape, dtype):
        if shape == 0:  # dynamic shared memory: one buffer, no lookup
            return dynamic(self, shape, dtype)
        if isinstance(dtype, kernelapi.types.Type):
            dtype = numpy_support.as_dtype(dtype)
        caller = sys._getframe(1)
        line = (caller.f_code.co_filename, caller.f_lineno)
        with lock:
            if line not in self._allocations:
                self._allocations[line] = kernelapi.np.empty(shape, dtype)
            return self._allocations[line]

    kernelapi.FakeCUDAShared.array = array


if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
    _serialise_simulated_shared_arrays()


def pytest_report_header(config):
    """The backend the suite runs on (FOLD_BACKEND; CI runs the suite once per backend)."""
    from fold.runtime.backends import get_backend

    return f"fold backend: {get_backend().name} (FOLD_BACKEND={os.environ.get('FOLD_BACKEND')!r})"


@pytest.fixture
def kernel_calls(monkeypatch):
    """Counts the kernels.cpu drivers the backend calls, so a test can tell a kernel ran (not a silent decline)."""
    from fold.kernels import cpu

    calls: dict[str, int] = {}
    for name in ("reduce", "scan", "histogram", "segmented_reduce", "map", "scan_pair_map", "map_scan", "logsumexp",
                 "column_sums", "product_fold", "product_first_extreme", "map_with_row_sums",
                 "map_with_column_sums"):
        original = getattr(cpu, name)

        def counted(*args, _name=name, _original=original, **kwargs):
            calls[_name] = calls.get(_name, 0) + 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(cpu, name, counted)
    run_prepared = cpu.MapReduce.__call__  # map_reduce runs one; elementwise_fusion.py keeps one per statement

    def counted_prepared(self, *args, **kwargs):
        calls["map_reduce"] = calls.get("map_reduce", 0) + 1
        return run_prepared(self, *args, **kwargs)

    monkeypatch.setattr(cpu.MapReduce, "__call__", counted_prepared)
    return calls


@pytest.fixture
def cuda_nest_kernels(monkeypatch):
    """The loop-nest kernels the cuda backend runs as CUDA kernels (not as the statements they replaced), in
    order; skips where there is neither a GPU nor Numba's simulator."""
    cuda = pytest.importorskip("numba.cuda")
    if not cuda.is_available():
        pytest.skip("no CUDA GPU, and NUMBA_ENABLE_CUDASIM is not set")
    from fold.runtime.cuda_backend import loop_nests

    kernels = []
    original = loop_nests._run
    monkeypatch.setattr(loop_nests, "_run", lambda prim, kernel, args: kernels.append(kernel) or original(prim, kernel, args))
    return kernels
