import os

from hypothesis import HealthCheck, settings

# CI draws the same examples every run (derandomize), so a red CI is never a roll of the dice; "dev" explores
settings.register_profile("ci", max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=100, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_report_header(config):
    """The backend the suite runs on (FOLD_BACKEND; CI runs the suite once per backend)."""
    from runtime.backends import get_backend

    return f"fold backend: {get_backend().name} (FOLD_BACKEND={os.environ.get('FOLD_BACKEND')!r})"
