import os

import pytest
from hypothesis import HealthCheck, settings

# check mode (runtime/operator_checks.py) is on in the suite, also where pytest is run without make
os.environ.setdefault("FOLD_CHECK", "1")

# CI draws the same examples every run (derandomize), so a red CI is never a roll of the dice; "dev" explores
settings.register_profile("ci", max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=100, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


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
                 "column_sums", "product_fold", "product_first_extreme", "map_with_row_sums", "map_histogram"):
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
