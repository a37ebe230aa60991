"""A loop folding an inner loop per iteration, swapped with it (runtime/numba_backend/nest_interchange.py): the
swapped kernel's shape, where it declines, and results equal to the unswapped kernel's, bit for bit."""

from __future__ import annotations

import re
import weakref

import numpy as np
import pytest

import fold
from fold.runtime.loops.nest import Assign, Buffer, Kernel, LaneFold, Loop, Param, ParallelMap, Store

pytest.importorskip("numba")

from fold.kernels.cpu import vector_math  # noqa: E402
from fold.runtime.numba_backend import loop_nests, nest_interchange, nest_lanes  # noqa: E402
from fold.runtime.numba_backend.nest_interchange import interchanged, transposed  # noqa: E402
from natural_programs import kmeans_cost, min_pairwise_distance  # noqa: E402

M = fold.monoids
rng = np.random.default_rng(5)
# float32 tanh over the units, as a loop in lanes calls it (four lanes: these programs are smaller than
# nest_lanes.WIDE_MIN_ITERATIONS)
TANH_F32 = vector_math.function_name("tanh", "float32", nest_lanes.WIDTH) + "("
F64 = np.dtype(np.float64)
SUM = LaneFold(("acc6",), ("np.float64(0.0)",), ("l0",), ("r0",), (Assign("t9", "np.float64((l0 + r0))"),), ("t9",))


@pytest.fixture(autouse=True)
def written_out_at_any_size(monkeypatch):
    """Short inner loops written out at these tests' sizes, as they are from WRITTEN_MIN_ITERATIONS steps per
    kernel call on (lowered to 0, with the compiled kernels of the same nests set aside)."""
    monkeypatch.setattr(nest_interchange, "WRITTEN_MIN_ITERATIONS", 0)
    monkeypatch.setattr(loop_nests, "_compiled", weakref.WeakKeyDictionary())


def _kmeans_like(inner: tuple | None = None, post: tuple | None = None, pre: tuple | None = None,
                 centroids: int = 8, dims: int = 4) -> Kernel:
    """Per point i: for each centroid c, acc6 = sum over j < dims of (P[i, j] - C[c, j])^2, folded into the
    minimum acc0; the minimum stored."""
    inner = inner if inner is not None else (
        Assign("e1", "in1[i, j]"), Assign("e2", "in0[c, j]"), Assign("t3", "np.float64(((e1 - e2) * (e1 - e2)))"),
        Assign("acc6", "np.float64((acc6 + t3))"))
    pre = pre if pre is not None else (Assign("acc6", "np.float64(0.0)"),)
    post = post if post is not None else (Assign("t4", "np.float64(_minimum(acc0, acc6))"), Assign("acc0", "t4"))
    per_centroid = Loop("c", centroids, (*pre, Loop("j", dims, inner, (SUM,)), *post))
    body = (Assign("acc0", "np.float64(np.inf)"), per_centroid, Store("out0", ("i",), "acc0"))
    params = (Param("in0", (centroids, dims), F64, "input"), Param("in1", (5, dims), F64, "input"),
              Param("out0", (5,), F64, "output"))
    return Kernel(params, ParallelMap("i", 5, body))


def test_the_centroid_loop_runs_innermost_reading_the_transposed_matrix():
    """40 dimensions over 1024 centroids: a block of the dimensions' steps written out would read too many
    rows of the transposed matrix side by side (SHORT_AREA), so each dimension's step sweeps the centroids'
    sums."""
    centroids = 1024
    assert nest_interchange.SHORT_AREA // centroids < nest_interchange.MIN_BLOCK
    kernel = interchanged(_kmeans_like(dims=nest_interchange.UNROLLED + 8, centroids=centroids))
    buffer, setting, swapped, rest = kernel.outer.body[1:5]
    assert buffer == Buffer("acc6__x", (centroids,), F64)
    assert setting == Loop("c", centroids, (Assign("acc6", "np.float64(0.0)"), Store("acc6__x", ("c",), "acc6")))
    assert swapped.index == "j" and swapped.extent == nest_interchange.UNROLLED + 8
    (sweep,) = swapped.body
    assert sweep.index == "c" and Assign("e2", "in0__T[j, c__u]") in sweep.body
    assert sweep.extent == "in0__T.shape[1]"  # not a constant: LLVM would unroll it into scalars
    assert Assign("e1", "in1[i, j]") in sweep.body  # no index c: read as it was
    assert sweep.body[:2] == (Assign("c__u", "np.uint64(c)"), Assign("acc6", "acc6__x[c__u]"))
    assert sweep.body[-1] == Store("acc6__x", ("c__u",), "acc6")
    # the sum read back under a name of its own (the swapped loops assign acc6 too), the rest as it was
    assert rest.body[0] == Assign("acc6__r", "acc6__x[c]")
    assert rest.body[1:] == (Assign("t4", "np.float64(_minimum(acc0, acc6__r))"), Assign("acc0", "t4"))
    assert transposed(kernel) == ["in0"] and transposed(_kmeans_like()) == []


def test_a_long_inner_loop_is_written_out_a_block_of_steps_at_a_time():
    """72 dimensions over 8 centroids: two blocks of UNROLLED steps, then the 8 left, each written out under
    the centroid loop (each centroid's sum loaded and stored once per block), in order: the same bits."""
    block = nest_interchange.UNROLLED
    kernel = interchanged(_kmeans_like(dims=2 * block + 8))
    buffer, setting, blocks, last, rest = kernel.outer.body[1:6]
    assert buffer == Buffer("acc6__x", (8,), F64)
    assert blocks.index == "j__k" and blocks.extent == 2
    start, sweep = blocks.body
    assert start == Assign("j__b", f"j__k * {block}")
    assert sweep.index == "c" and sweep.extent == "in0__T.shape[1]"
    assert sweep.body[:2] == (Assign("c__u", "np.uint64(c)"), Assign("acc6", "acc6__x[c__u]"))
    assert sweep.body[2:4] == (Assign("e1", "in1[i, j__b + 0]"), Assign("e2", "in0__T[j__b + 0, c__u]"))
    assert sweep.body[-4] == Assign("e2", f"in0__T[j__b + {block - 1}, c__u]")
    assert len(sweep.body) == 2 + 4 * block + 1 and sweep.body[-1] == Store("acc6__x", ("c__u",), "acc6")
    assert last.index == "c" and len(last.body) == 2 + 4 * 8 + 1
    assert last.body[2:4] == (Assign("e1", f"in1[i, {2 * block}]"), Assign("e2", f"in0__T[{2 * block}, c__u]"))
    assert rest.body[0] == Assign("acc6__r", "acc6__x[c]")


@pytest.mark.parametrize("dims", [4, nest_interchange.UNROLLED])
def test_a_short_inner_loop_is_written_out_under_the_centroid_loop(dims):
    """Few dimensions: each centroid's sum a register, loaded and stored once, the steps written out (LLVM
    vectorises them across the centroids, read from the transposed matrix)."""
    kernel = interchanged(_kmeans_like(dims=dims))
    buffer, setting, centroids, rest = kernel.outer.body[1:5]
    assert buffer == Buffer("acc6__x", (8,), F64)
    assert setting == Loop("c", 8, (Assign("acc6", "np.float64(0.0)"), Store("acc6__x", ("c",), "acc6")))
    assert centroids.index == "c" and centroids.extent == "in0__T.shape[1]"
    assert centroids.body[:2] == (Assign("c__u", "np.uint64(c)"), Assign("acc6", "acc6__x[c__u]"))
    steps = [(Assign("e1", f"in1[i, {j}]"), Assign("e2", f"in0__T[{j}, c__u]"),
              Assign("t3", "np.float64(((e1 - e2) * (e1 - e2)))"), Assign("acc6", "np.float64((acc6 + t3))"))
             for j in range(dims)]
    assert centroids.body[2:-1] == sum(steps, ())  # in order: the same bits
    assert centroids.body[-1] == Store("acc6__x", ("c__u",), "acc6")
    assert rest.body[0] == Assign("acc6__r", "acc6__x[c]")


def test_a_short_inner_loop_of_a_small_kernel_is_swapped_outermost(monkeypatch):
    """Below WRITTEN_MIN_ITERATIONS steps per call the compile time of the copies would not be won back: 5
    points x 8 centroids x 4 dimensions here, and the control at exactly that many."""
    monkeypatch.setattr(nest_interchange, "WRITTEN_MIN_ITERATIONS", 5 * 8 * 4 + 1)
    swapped = interchanged(_kmeans_like()).outer.body[3]
    assert swapped.index == "j" and swapped.body[0].index == "c"
    monkeypatch.setattr(nest_interchange, "WRITTEN_MIN_ITERATIONS", 5 * 8 * 4)
    assert interchanged(_kmeans_like()).outer.body[3].index == "c"


def test_a_short_inner_loop_over_a_large_matrix_is_swapped_outermost():
    """Written out, a sweep would read SHORT_AREA / 4 + 1 rows of the transposed matrix side by side, each row
    as long as the centroid loop (attention's keys: 8 KB apart, one set of the first-level cache)."""
    rows = nest_interchange.SHORT_AREA // 4
    assert interchanged(_kmeans_like(centroids=rows)).outer.body[3].index == "c"  # the control
    swapped = interchanged(_kmeans_like(centroids=rows + 1)).outer.body[3]
    assert swapped.index == "j" and swapped.body[0].index == "c"


def test_a_short_inner_loop_of_many_statements_is_swapped_outermost():
    """Beyond UNROLLED_STATEMENTS in all the steps are not written out (compile time grows with the text)."""
    def inner(statements: int) -> tuple:
        scaled = tuple(Assign(f"e{k}", f"np.float64((in1[i, j] * {k + 1}.0))") for k in range(statements - 1))
        return (*scaled, Assign("acc6", "np.float64((acc6 + (e0 * in0[c, j])))"))

    most = nest_interchange.UNROLLED_STATEMENTS // 4  # four dimensions: Numba compiles each one written out
    swapped = interchanged(_kmeans_like(inner=inner(most + 1))).outer.body[3]
    assert swapped.index == "j" and swapped.body[0].index == "c"
    assert interchanged(_kmeans_like(inner=inner(most))).outer.body[3].index == "c"  # the control


def test_a_value_carried_from_one_inner_iteration_to_the_next_keeps_the_loops_as_they_were():
    """t7 is read before it is assigned: each centroid's first step reads the previous centroid's last t7."""
    kernel = _kmeans_like(inner=(Assign("t3", "np.float64((t7 * 2.0))"), Assign("t7", "in0[c, j]"),
                                 Assign("acc6", "np.float64((acc6 + t3))")))
    assert interchanged(kernel) == kernel


def test_a_value_the_outer_iteration_sets_after_the_inner_loop_and_the_inner_loop_reads_keeps_them():
    kernel = _kmeans_like(inner=(Assign("t3", "in0[c, j]"), Assign("acc6", "np.float64(((acc6 + t3) + t5))")),
                          post=(Assign("t5", "np.float64(_minimum(acc0, acc6))"), Assign("acc0", "t5")))
    assert interchanged(kernel) == kernel


def test_an_inner_value_read_after_the_inner_loop_keeps_them():
    """e2 after the loop is the last centroid's: swapped, every centroid would read the last one's."""
    kernel = _kmeans_like(post=(Assign("t4", "np.float64(_minimum(acc0, (acc6 + e2)))"), Assign("acc0", "t4")))
    assert interchanged(kernel) == kernel


def test_an_accumulator_of_no_written_type_keeps_them():
    """A buffer of a guessed type could round the accumulator."""
    kernel = _kmeans_like(pre=(Assign("acc6", "0.0"),))
    assert interchanged(kernel) == kernel


def test_an_inner_loop_of_transcendentals_is_left_to_the_lanes():
    inner = (Assign("e1", "in1[i, j]"), Assign("e2", "in0[c, j]"), Assign("t3", "np.float64(math.exp((e1 - e2)))"),
             Assign("acc6", "np.float64((acc6 + t3))"))
    kernel = _kmeans_like(inner=inner)
    wide = Loop("j", 16, inner, (SUM,))
    kernel16 = Kernel(kernel.params, ParallelMap("i", 5, (kernel.outer.body[0], Loop("c", 8, (
        Assign("acc6", "np.float64(0.0)"), wide, *kernel.outer.body[1].body[2:])), kernel.outer.body[2])))
    assert interchanged(kernel16) == kernel16
    assert interchanged(kernel) != kernel  # four exponentials per row are too few for lanes


def test_too_few_outer_iterations_keep_them():
    kernel = _kmeans_like(centroids=nest_interchange.MIN_EXTENT - 1)
    assert interchanged(kernel) == kernel


def _unswapped(monkeypatch, f, *args):
    """f's results on the numba backend with loops never swapped (kernels compiled anew)."""
    with monkeypatch.context() as m:
        m.setattr(nest_interchange, "interchanged", lambda kernel: kernel)
        m.setattr(loop_nests, "_compiled", weakref.WeakKeyDictionary())
        return fold.jit(f, backend="numba")(*args)


def _sources(f, *args) -> str:
    from fold.runtime.loops import LoopNest, kernel_of
    from fold.runtime.numba_backend.passes import prepare

    program = prepare(fold.trace(f, *args), whole_arrays=True)
    return "\n".join(loop_nests.kernel_source(kernel_of(s.prim)) for s in program.stmts if isinstance(s.prim, LoopNest))


def _pairwise(C, P):
    return fold.map(lambda p: fold.map(lambda c: fold.sum((p - c) * (p - c)), C), P)


CASES = {
    "kmeans float32": (kmeans_cost, lambda: (rng.normal(size=(19, 7)).astype(np.float32),
                                             rng.normal(size=(301, 7)).astype(np.float32))),
    "kmeans gradient": (fold.grad(kmeans_cost), lambda: (rng.normal(size=(9, 3)), rng.normal(size=(101, 3)))),
    "min pairwise": (min_pairwise_distance, lambda: (rng.normal(size=(90, 3)), rng.normal(size=(40, 3)))),
    "kmeans hessian-vector product": (
        lambda C, P: fold.jvp(fold.grad(kmeans_cost), (C, P), (np.ones_like(C), np.zeros_like(P)))[1],
        lambda: (rng.normal(size=(12, 3)).astype(np.float32), rng.normal(size=(57, 3)).astype(np.float32))),
    "kmeans 72 dimensions": (kmeans_cost, lambda: (rng.normal(size=(9, 72)), rng.normal(size=(101, 72)))),
    "pairwise matrix": (_pairwise, lambda: (rng.normal(size=(33, 5)).astype(np.float32),
                                            rng.normal(size=(70, 5)).astype(np.float32))),
}


@pytest.mark.parametrize("written", [True, False], ids=["written-out", "swapped"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_swapped_kernels_give_the_unswapped_results_bit_for_bit(case, written, monkeypatch):
    if not written:
        monkeypatch.setattr(nest_interchange, "WRITTEN_MIN_ITERATIONS", 2 ** 62)
    f, make = CASES[case]
    args = make()
    source = _sources(f, *args)
    assert "__T = np.ascontiguousarray(" in source
    # a step written out reads a literal row, or one at an offset into its block of steps
    assert bool(re.search(r"__T\[(\d+|\w+__b \+ \d+), ", source)) == written
    got = fold.jit(f, backend="numba")(*args)
    plain = _unswapped(monkeypatch, f, *args)
    want = fold.jit(f, backend="numpy")(*args)
    for g, p, w in zip(fold.tree_flatten(got)[0], fold.tree_flatten(plain)[0], fold.tree_flatten(want)[0], strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(p))
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5)


def test_lowered_shows_the_swapped_loops_and_their_buffer():
    C, P = rng.normal(size=(16, 4)), rng.normal(size=(50, 4))
    text = str(fold.lowered(kmeans_cost, C, P))
    assert "__T[" in text and "__x: float64[16]" in text, text


def test_a_value_the_inner_loop_does_not_read_moves_after_it():
    """A mixture's per-component log-weight, set before the component's sum and read after it."""
    weight = Assign("t2", "in2[c]")
    post = (Assign("t4", "np.float64(_minimum(acc0, (acc6 - t2)))"), Assign("acc0", "t4"))
    kernel = _kmeans_like(pre=(weight, Assign("acc6", "np.float64(0.0)")), post=post)
    rest = interchanged(kernel).outer.body[4]
    renamed = (Assign("t4", "np.float64(_minimum(acc0, (acc6__r - t2)))"), Assign("acc0", "t4"))
    assert rest.body == (Assign("acc6__r", "acc6__x[c]"), weight, *renamed), rest


def test_a_value_set_before_the_inner_loop_and_read_in_it_keeps_them():
    inner = (Assign("e1", "in1[i, j]"), Assign("acc6", "np.float64(((acc6 + e1) * t2))"))
    kernel = _kmeans_like(pre=(Assign("t2", "in2[c]"), Assign("acc6", "np.float64(0.0)")), inner=inner)
    assert interchanged(kernel) == kernel


def test_a_value_set_before_the_inner_loop_from_an_accumulator_keeps_them():
    """t2 is twice acc6's starting value; after the inner loop, acc6 holds its sum."""
    post = (Assign("t4", "np.float64(_minimum(acc0, (acc6 - t2)))"), Assign("acc0", "t4"))
    kernel = _kmeans_like(pre=(Assign("acc6", "np.float64(0.0)"), Assign("t2", "np.float64((acc6 * 2.0))")), post=post)
    assert interchanged(kernel) == kernel


@pytest.mark.parametrize("case", ["kmeans float32", "kmeans gradient"])
def test_swapped_loops_compiled_in_parts_read_the_transposes_the_kernel_made(case, monkeypatch):
    """A body longer than nest_parts.WHOLE is compiled as functions called in turn: the parts that read a
    transposed matrix are passed the one the kernel copied before its traversal."""
    from fold.runtime.numba_backend import nest_parts

    f, make = CASES[case]
    args = make()
    whole = fold.jit(f, backend="numba")(*args)
    monkeypatch.setattr(nest_parts, "WHOLE", 8)
    monkeypatch.setattr(nest_parts, "PART", 6)
    monkeypatch.setattr(loop_nests, "_compiled", weakref.WeakKeyDictionary())
    text = _sources(f, *args)
    assert "def part" in text and "__T[" in text.split("def kernel")[0], text
    got = fold.jit(f, backend="numba")(*args)
    for g, w in zip(fold.tree_flatten(got)[0], fold.tree_flatten(whole)[0], strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


@pytest.mark.parametrize("centroids, swapped", [(nest_interchange.UNROLLED, False), (64, True)])
def test_a_short_loop_with_no_matrix_to_read_its_trip_count_from_keeps_them(centroids, swapped):
    """Reading C[j, c] (no transpose needed), the swapped loop's trip count would be a constant, which LLVM
    unrolls into scalar statements up to UNROLLED iterations."""
    inner = (Assign("e1", "in1[i, j]"), Assign("e2", "in0[j, c]"), Assign("acc6", "np.float64((acc6 + (e1 * e2)))"))
    kernel = _kmeans_like(inner=inner, centroids=centroids)
    assert (interchanged(kernel) != kernel) == swapped
    if swapped:  # the centroids around the dimensions written out
        assert interchanged(kernel).outer.body[3].extent == 64 and interchanged(kernel).outer.body[3].index == "c"
        assert Assign("e2", "in0[3, c__u]") in interchanged(kernel).outer.body[3].body


def _two_sums(second: tuple, between: tuple = ()) -> Kernel:
    """Per point i and centroid c: acc6 sums (P[i, j] - C[c, j])^2, then `between`, then acc7 sums `second`'s
    last value over j; the minimum of acc6 + acc7 over the centroids stored."""
    first = (Assign("e1", "in1[i, j]"), Assign("e2", "in0[c, j]"), Assign("t3", "np.float64(((e1 - e2) * (e1 - e2)))"),
             Assign("acc6", "np.float64((acc6 + t3))"))
    post = (Assign("t4", "np.float64(_minimum(acc0, (acc6 + acc7)))"), Assign("acc0", "t4"))
    per_centroid = Loop("c", 8, (Assign("acc6", "np.float64(0.0)"), Loop("j", 4, first), *between,
                                 Assign("acc7", "np.float64(0.0)"), Loop("k", 4, second), *post))
    body = (Assign("acc0", "np.float64(np.inf)"), per_centroid, Store("out0", ("i",), "acc0"))
    params = (Param("in0", (8, 4), F64, "input"), Param("in1", (5, 4), F64, "input"), Param("out0", (5,), F64, "output"))
    return Kernel(params, ParallelMap("i", 5, body))


def test_each_of_several_inner_loops_is_swapped_and_a_later_one_reads_an_earlier_ones_sums():
    """A Hessian-vector product's loop per centroid sums the distance, then its tangent: loop distribution,
    each inner loop swapped; the second reads the first's final sums from their buffer."""
    second = (Assign("e8", "in0[c, k]"), Assign("acc7", "np.float64((acc7 + (e8 * acc6)))"))
    kernel = interchanged(_two_sums(second))
    nodes = kernel.outer.body
    setting, first, later, rest = nodes[3:7]
    assert [b.name for b in nodes[1:3]] == ["acc6__x", "acc7__x"], nodes
    assert [n.index for n in (first, later)] == ["c", "c"]
    assert Assign("e1", "in1[i, 3]") in first.body and Assign("e8", "in0__T[3, c__u]") in later.body
    assert later.extent == "in0__T.shape[1]"
    assert Assign("acc6", "acc6__x[c__u]") in later.body  # read, final, not stored
    assert Store("acc6__x", ("c__u",), "acc6") not in later.body
    assert rest.body[-2:] == (Assign("t4", "np.float64(_minimum(acc0, (acc6__r + acc7__r)))"), Assign("acc0", "t4"))


def test_an_inner_loop_reading_a_later_inner_loops_accumulator_keeps_them():
    """acc7 read by the first loop is the previous centroid's final value (its start is set after it)."""
    first_reads_later = (Assign("e8", "in0[c, k]"), Assign("acc7", "np.float64((acc7 + e8))"))
    kernel = _two_sums(first_reads_later)
    swapped_kernel = interchanged(kernel)
    assert swapped_kernel != kernel  # the control: as written, both loops swap
    first = (Assign("e1", "in1[i, j]"), Assign("acc6", "np.float64((acc6 + (e1 * acc7)))"))
    bad = Kernel(kernel.params, ParallelMap("i", 5, (kernel.outer.body[0], Loop("c", 8, (
        Assign("acc6", "np.float64(0.0)"), Loop("j", 4, first), Assign("acc7", "np.float64(0.0)"),
        Loop("k", 4, first_reads_later), *kernel.outer.body[1].body[-2:])), kernel.outer.body[2])))
    assert interchanged(bad) == bad


def test_a_value_computed_between_inner_loops_from_the_first_ones_sum_keeps_them():
    """A layer norm's mean between its two loops: the second loop would read it before the first is done."""
    second = (Assign("e8", "in0[c, k]"), Assign("acc7", "np.float64((acc7 + (e8 - t9)))"))
    kernel = _two_sums(second, between=(Assign("t9", "np.float64((acc6 / 4.0))"),))
    assert interchanged(kernel) == kernel


def test_an_accumulator_two_inner_loops_fold_into_keeps_them():
    second = (Assign("e8", "in0[c, k]"), Assign("acc6", "np.float64((acc6 + e8))"), Assign("acc7", "np.float64((acc7 + e8))"))
    kernel = _two_sums(second)
    assert interchanged(kernel) == kernel


def test_a_transcendental_of_each_swapped_sum_runs_in_vector_calls():
    """An MLP layer's tanh of each unit's dot product: the sums are read back from their buffer under names
    of their own, so the loop over the units runs tanh several units per vector call rather than once per
    unit (nest_lanes would take a name the swapped loops assign too for one carried between them)."""
    def layer(W, X):
        return fold.sum(fold.map(lambda x: fold.sum(fold.map(lambda w: fold.tanh(fold.sum(x * w)), W)), X))

    W = rng.normal(size=(16, 8)).astype(np.float32)
    X = rng.normal(size=(40, 8)).astype(np.float32)
    text = _sources(layer, W, X)
    assert "in0__T[" in text and TANH_F32 in text and "math.tanh" not in text, text
    np.testing.assert_allclose(fold.jit(layer)(W, X), np.tanh(X.astype(np.float64) @ W.T).sum(), rtol=1e-5, atol=1e-4)


def test_a_short_loop_over_columns_reads_its_trip_count_from_the_matrix():
    """A weighted sum of a matrix's rows (attention's values): per column a fold over the rows, read [row,
    column]. Swapped, the column loop runs innermost over contiguous elements, its trip count read from the
    matrix's shape (a constant this short would be unrolled into scalars, not vectorised)."""
    def weighted_rows(E, V):
        return fold.map(lambda e: fold.sum(fold.map(lambda ej, v: ej * v, e, V), axis=0), E)

    E = rng.normal(size=(6, 40)).astype(np.float32)
    V = rng.normal(size=(40, 16)).astype(np.float32)
    text = _sources(weighted_rows, E, V)
    assert re.search(r"for \w+ in range\(in\d\.shape\[1\]\)", text) and "__T" not in text, text
    np.testing.assert_allclose(fold.jit(weighted_rows)(E, V), E.astype(np.float64) @ V, rtol=1e-5, atol=1e-5)


def test_a_transcendental_before_a_row_stored_per_unit_runs_in_vector_calls():
    """Per unit, tanh of the unit's sum, then the row tanh(s) sin(x) stored (its sine keeps the row from
    being pulled from the units' scalars, build.row_scalars). The straight-line statements run as a loop of
    their own, in vector calls, keeping what the row loop reads in a buffer; the row loop follows."""
    def layer(W, X):
        return fold.map(lambda x: fold.sum(fold.map(lambda w: fold.tanh(fold.sum(x * w)) * fold.sin(x), W), axis=0), X)

    W = (0.3 * rng.normal(size=(16, 8))).astype(np.float32)
    X = rng.normal(size=(40, 8)).astype(np.float32)
    text = _sources(layer, W, X)
    assert "in0__T[" in text and TANH_F32 in text and "math.tanh" not in text and "__y[" in text, text
    X64 = X.astype(np.float64)
    want = np.sin(X64) * np.tanh(X64 @ W.T.astype(np.float64)).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(fold.jit(layer)(W, X), want, rtol=2e-5, atol=1e-5)


def test_a_layers_gradient_adds_each_units_row_into_the_sum_as_it_is_made():
    """The MLP layer's gradient for its weights: per point and unit, the row t'(s) x is a scalar of the
    unit times the point. Only the units' scalars are stored (after the swapped sums, in vector calls);
    each row's elements are added into the fold's state where they are made, no row buffer written and
    read back."""
    def layer(W, X):
        return fold.sum(fold.map(lambda x: fold.sum(fold.map(lambda w: fold.tanh(fold.sum(x * w)), W)), X))

    W = (0.3 * rng.normal(size=(16, 8))).astype(np.float32)
    X = rng.normal(size=(40, 8)).astype(np.float32)
    grad = fold.grad(layer)
    from fold.runtime.loops import LoopNest, kernel_of
    from fold.runtime.loops.nest import buffers
    from fold.runtime.numba_backend.passes import prepare

    kernels = [kernel_of(s.prim) for s in prepare(fold.trace(grad, W, X), whole_arrays=True).stmts
               if isinstance(s.prim, LoopNest)]
    (kernel,) = [k for k in kernels if any(p.shape == W.shape for p in k.folded)]  # the one summing over points
    shapes = [b.shape for b in buffers(kernel.outer.step)]
    assert shapes and all(len(shape) == 1 for shape in shapes), shapes  # the units' scalars, not (16, 8) rows
    text = _sources(grad, W, X)
    assert "in0__T[" in text and TANH_F32 in text and "math.tanh" not in text, text
    t = np.tanh(X.astype(np.float64) @ W.T.astype(np.float64))
    np.testing.assert_allclose(fold.jit(grad)(W, X), (1 - t * t).T @ X, rtol=2e-5, atol=1e-5)


def test_a_value_computed_between_inner_loops_from_the_first_ones_sum_runs_after_both():
    """tanh of the first sum written before the second loop (a Hessian-vector product's layer): it reads the
    first loop's final sum, so it moves after both swapped loops and reads that sum from its buffer."""
    second = (Assign("e8", "in0[c, k]"), Assign("acc7", "np.float64((acc7 + e8))"))
    kernel = _two_sums(second, between=(Assign("t9", "np.float64((acc6 * 2.0))"),))
    swapped = interchanged(kernel)
    rest = swapped.outer.body[-2]
    assert rest.index == "c" and rest.body[:3] == (
        Assign("acc6__r", "acc6__x[c]"), Assign("acc7__r", "acc7__x[c]"), Assign("t9", "np.float64((acc6__r * 2.0))"))


def test_a_layers_hessian_vector_product_swaps_both_sums_and_matches_numpy():
    def layer(W, X):
        return fold.sum(fold.map(lambda x: fold.sum(fold.map(lambda w: fold.tanh(fold.sum(x * w)), W)), X))

    W = (0.3 * rng.normal(size=(16, 8))).astype(np.float32)
    X = rng.normal(size=(40, 8)).astype(np.float32)
    V = rng.normal(size=W.shape).astype(np.float32)
    hvp = lambda W, X: fold.jvp(fold.grad(layer), (W, X), (V, np.zeros_like(X)))[1]  # noqa: E731
    text = _sources(hvp, W, X)
    assert text.count("__T = np.ascontiguousarray(") == 2 and TANH_F32 in text, text
    np.testing.assert_allclose(fold.jit(hvp, backend="numba")(W, X), fold.jit(hvp, backend="numpy")(W, X),
                               rtol=1e-4, atol=1e-5)


def test_blocks_of_steps_are_written_only_in_a_body_compiled_whole(monkeypatch):
    """A body past nest_parts.WHOLE statements is compiled in parts, where a block would call a part per
    iteration: there the long inner loop keeps the sweep (loop_nests.as_run)."""
    from fold.runtime.numba_backend import nest_parts

    kernel = _kmeans_like(dims=2 * nest_interchange.UNROLLED + 8)
    blocked = loop_nests.as_run(kernel)
    assert blocked.outer.body[3].index == "j__k"
    monkeypatch.setattr(nest_parts, "WHOLE", loop_nests._laned_size(blocked) - 1)
    swept = loop_nests.as_run(kernel).outer.body[3]
    assert swept.index == "j" and swept.body[0].index == "c"
