"""The benchmarks' own instruments, which no benchmark run would notice going blind."""

import json
import re

import numpy as np
import pytest

import fold
from benchmarks.bench_ad import statement_profile


def test_the_statement_profile_sees_every_statement_of_a_jitted_call():
    f = fold.jit(lambda x: fold.reduce(fold.monoids.sum, fold.sin(x) * x), backend="numpy")
    x = np.linspace(0.0, 1.0, 1000)
    rows = statement_profile(lambda: f(x))
    assert {row["statement"] for row in rows} == {"sin", "mul", "reduce"}
    assert all(row["count"] == 1 and row["seconds"] > 0.0 for row in rows)
    reduce_row = next(row for row in rows if row["statement"] == "reduce")
    assert reduce_row["out_shapes"] == "[]" and reduce_row["out_bytes"] == 8


def test_a_dask_workers_peak_rss_is_its_own_not_the_clients():
    """bench_dask's per-worker peak must count the worker's memory alone. A worker is started by fork + exec
    from the client, and ru_maxrss keeps the peak from before the exec (the client's RSS at the fork): with
    300 MB touched here first, it reports at least that for an idle worker. VmHWM does not."""
    pytest.importorskip("distributed")
    from distributed import Client, LocalCluster

    from benchmarks.bench_dask import _peak_rss, _reset_peak

    ballast = np.ones(300 * 2**20 // 8)  # touched: resident in this process when the worker is forked
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        peak = next(iter(client.run(_peak_rss).values()))
        assert all(client.run(_reset_peak).values())
        after_reset = next(iter(client.run(_peak_rss).values()))
    # a reset sets the mark to the RSS now, which may have grown by a page since the first reading
    assert 0 < peak < ballast.nbytes and 0 < after_reset < ballast.nbytes, (peak, after_reset)


def test_the_dask_model_splits_one_workers_task_compute_and_keeps_the_rest_of_its_call_fixed():
    """bench_dask's model: compute is what one single-threaded worker's tasks took (divided among workers),
    overhead the rest of that call; a combine level per doubling costs latency + bytes / bandwidth."""
    from benchmarks.bench_dask import BANDWIDTH, LATENCY, model_of

    call = {"seconds": 12.0, "worker_task_seconds": {"w1": {"compute": 10.0, "transfer": 0.0, "other": 0.0}}}
    model = model_of(call, 1e6, 7.5)
    assert model["compute_1_s"] == 10.0 and model["overhead_s"] == 2.0
    assert abs(model["predicted_2_workers_s"] - (2.0 + 5.0 + LATENCY + 1e6 / BANDWIDTH)) < 1e-12
    assert abs(model["curve"][8] - (2.0 + 10.0 / 8 + 3 * (LATENCY + 1e6 / BANDWIDTH))) < 1e-12
    assert model["measured_2_workers_s"] == 7.5


def test_the_ab_digest_tells_a_changed_program_from_the_same_one(monkeypatch):
    """bench_ab calls a slower reading noise only where both trees ran the same programs: its digest must
    differ when the numba backend prepares the same traced program differently (a fold of a map as a loop
    nest, or as the older passes leave it), and agree when it prepares it the same way again."""
    pytest.importorskip("numba")
    from benchmarks.bench_ab import case_names, digest_of
    from fold.runtime.numba_backend import passes

    x = np.linspace(0.0, 1.0, 1000)

    def prepared():  # a new function each time: a new Program, which prepare has not seen
        return passes.prepare(fold.trace(lambda x: fold.reduce(fold.monoids.sum, fold.map(lambda v: v * v, x)), x),
                              whole_arrays=True)

    first, again = prepared(), prepared()
    assert first is not again and [s.prim.name for s in first.stmts] == ["loop_nest"]
    nested = digest_of([first])
    assert len(nested) == 16 and digest_of([again]) == nested
    monkeypatch.setattr(passes, "loop_nests_on", lambda: False)
    unnested = prepared()
    assert [s.prim.name for s in unnested.stmts] == ["map", "reduce"]
    assert digest_of([unnested]) != nested
    kinds = {case.split(":")[0] for case, _ in case_names()}
    assert kinds == {"numba", "ad", "gemm", "natural", "families", "flat"}


def test_ab_sets_add_bench_naturals_other_sets_and_name_an_unknown_one():
    from benchmarks import bench_ab, bench_natural

    extra = [(c, m) for c, m in bench_ab.case_names(("untuned", "numpy")) if c.split(":")[0] in ("untuned", "numpy")]
    assert {c.split(":", 1)[1] for c, _ in extra} == set(bench_natural.SETS["untuned"](False)) | set(
        bench_natural.SETS["numpy"](False))
    assert {m for _, m in extra} == set(bench_natural.MODES)
    with pytest.raises(SystemExit):
        bench_ab.main(["HEAD", "--sets", "untuned,bogus"])


def test_product_forms_nest_switch_gives_every_product_to_the_nest(monkeypatch):
    pytest.importorskip("numba")
    from benchmarks import product_forms
    from fold.runtime.numba_backend import passes

    for name in ("MAX_NEST_PRODUCT_BYTES", "MAX_NEST_PRODUCT_BYTES_FLOAT64", "sparse_one_hots", "mark_first_extremes",
                 "fuse_product_folds", "absorb_gathers"):
        monkeypatch.setattr(passes, name, getattr(passes, name))  # restored after the test
    bodies = [fold.trace(lambda W, X: fold.map(lambda x: fold.sum(fold.tanh(W @ x)), X), W, W).stmts[0].prim.body
              for W in (np.ones((300, 300), np.float32), np.ones((300, 300)))]
    assert not any(passes.nest_takes_products(body) for body in bodies)
    product_forms._every_product_in_the_nest()
    assert all(passes.nest_takes_products(body) for body in bodies)


def test_setting_ab_compiles_each_program_under_both_values_and_restores_the_setting():
    pytest.importorskip("numba")
    from benchmarks import product_forms, setting_ab
    from fold.runtime.loops import extreme_pairs

    kept = extreme_pairs.NARROWED_MAX
    seen = []
    make, args = product_forms.kmeans_calls(300, 4, 2 * extreme_pairs.MAX_PAIRED + 8, np.float64)["grad"]

    def maker():
        f = make()

        def spy(*xs):
            seen.append(extreme_pairs.NARROWED_MAX)  # the value while it is traced
            return f(*xs)
        jitted = fold.jit(spy, backend="numba")
        return lambda: jitted(*args)

    got = setting_ab.compare({"grad": maker}, "fold.runtime.loops.extreme_pairs:NARROWED_MAX=2147483647,0", rounds=2)
    assert seen == [2147483647, 0] and extreme_pairs.NARROWED_MAX == kept
    assert re.fullmatch(r"\d+\.\d\d / \d+\.\d\d \(\d+\.\d\d\)", got["grad"]), got
    with pytest.raises(SystemExit, match="has no NOT_A_CONSTANT"):
        setting_ab.compare({"grad": maker}, "fold.runtime.loops.extreme_pairs:NOT_A_CONSTANT=1,2")
    with pytest.raises(SystemExit, match="expected module:NAME=A,B"):
        setting_ab.compare({"grad": maker}, "fold.runtime.loops.extreme_pairs:NARROWED_MAX=1")


def test_setting_ab_records_merge_into_one_json_and_plot(tmp_path, monkeypatch):
    from benchmarks import setting_ab

    monkeypatch.setattr(setting_ab, "RESULTS", tmp_path)
    first = {"grad": {"a_ms": 2.0, "b_ms": 4.0, "ratio": 0.5, "a_samples_ms": [2.0], "b_samples_ms": [4.0]}}
    setting_ab.record("ab", "m:X=1,2", first, prefix="kmeans ")
    again = {"grad": {**first["grad"], "a_ms": 3.0, "ratio": 0.75},
             "hvp": {"a_ms": 1.0, "b_ms": 1.0, "ratio": 1.0, "a_samples_ms": [1.0], "b_samples_ms": [1.0]}}
    path = setting_ab.record("ab", "m:X=1,2", again, prefix="kmeans ")
    payload = json.loads(path.read_text())
    assert [(r["name"], r["a_ms"], r["setting"]) for r in payload["records"]] == [
        ("kmeans grad", 3.0, "m:X=1,2"), ("kmeans hvp", 1.0, "m:X=1,2")]  # replaced, not duplicated
    assert "cpu" in json.dumps(payload["machine"]).lower()
    pytest.importorskip("matplotlib")
    assert (tmp_path / "ab.png").stat().st_size > 0
