"""np.einsum inside traced functions (fold/numpy_einsum.py): NumPy's values on random operands for each form
of subscripts (explicit, implicit, '...', diagonals, broadcasting, three operands, empty axes), every
program verified, gradients against finite differences, each pair rule exercised, and subscripts that do
not fit their operands refused with errors naming them."""

from __future__ import annotations

import numpy as np
import pytest

import fold
from fold import numpy_einsum
from fold.testing import check_grads

from helpers import checked_program

RNG = np.random.default_rng(11)

CASES = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("ij,jk", [(3, 4), (4, 5)]),                        # implicit: the letters seen once, in order
    ("ij,kj->ik", [(3, 4), (5, 4)]),
    ("i,i", [(4,)]*2),                                  # inner product
    ("i,i->i", [(4,)]*2),                               # elementwise product
    ("i,j->ij", [(3,), (4,)]),                          # outer product
    ("ij->ji", [(3, 4)]),
    ("ij->", [(3, 4)]),
    ("ij->j", [(3, 4)]),
    ("ii->i", [(3, 3)]),                                # diagonal
    ("ii", [(3, 3)]),                                   # trace
    ("iij->ij", [(3, 3, 2)]),
    ("ij,j->i", [(3, 4), (4,)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),           # batched matmul: a map of matmuls
    ("bi,bi->b", [(3, 4), (3, 4)]),                     # batched dot: a multiply and a sum
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)]),  # attention scores
    ("...ij,...jk->...ik", [(2, 3, 4), (4, 5)]),        # '...' broadcast
    ("...i->...", [(2, 3, 4)]),
    ("...", [(2, 3)]),
    ("ij,ij->i", [(2, 1), (2, 3)]),                     # a length-1 axis broadcasts
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
    ("ij,jk,ik->", [(2, 3), (3, 4), (2, 4)]),
    ("Ba", [(2, 3)]),                                   # implicit order: ASCII, capitals first
    ("ab,cd->abcd", [(2, 3), (4, 2)]),
    ("ij,jk->ik", [(0, 4), (4, 5)]),                    # empty axes
    ("ij,j->i", [(3, 0), (0,)]),
]


def _operands(shapes):
    return [RNG.normal(size=s) for s in shapes]


@pytest.mark.parametrize("subscripts,shapes", CASES, ids=[c[0] for c in CASES])
def test_einsum_matches_numpy(subscripts, shapes) -> None:
    operands = _operands(shapes)
    f = lambda *a: np.einsum(subscripts, *a)  # noqa: E731
    checked_program(f, *operands)
    got, want = fold.jit(f)(*operands), f(*operands)
    assert np.shape(got) == np.shape(want)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("subscripts,shapes", [c for c in CASES if 0 not in sum(c[1], ())], ids=lambda c: str(c))
def test_einsum_gradients_against_finite_differences(subscripts, shapes) -> None:
    operands = tuple(_operands(shapes))
    check_grads(lambda *a: np.sum(np.sin(np.einsum(subscripts, *a))), operands, order=1)


def test_einsum_of_integers_and_float32_keeps_numpys_dtype() -> None:
    a, b = np.arange(12, dtype=np.int64).reshape(3, 4), np.arange(8, dtype=np.int64).reshape(4, 2)
    got = fold.jit(lambda a, b: np.einsum("ij,jk->ik", a, b))(a, b)
    np.testing.assert_array_equal(got, np.einsum("ij,jk->ik", a, b))
    assert got.dtype == np.int64
    x = RNG.normal(size=(3, 4)).astype(np.float32)
    assert fold.jit(lambda x: np.einsum("ij,ij->i", x, x))(x).dtype == np.float32
    np.testing.assert_allclose(fold.jit(lambda x: np.einsum("ij->i", x, dtype=np.float64, optimize=True))(x),
                               np.einsum("ij->i", x, dtype=np.float64), rtol=1e-12)


@pytest.mark.parametrize("subscripts,shapes,rule", [
    ("ij,jk->ik", [(3, 4), (4, 5)], "_matmul_2d"),
    ("bi,bi->b", [(3, 4), (3, 4)], "_broadcast_product"),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)], "_batched_matmul"),
])
def test_each_pair_rule_is_chosen_where_meant(subscripts, shapes, rule) -> None:
    a, la = None, tuple(subscripts.split("->")[0].split(",")[0])
    b, lb = None, tuple(subscripts.split("->")[0].split(",")[1])
    sizes = {k: n for s, ls in zip(shapes, (la, lb), strict=True) for k, n in zip(ls, s, strict=True)}
    pair = numpy_einsum.Pair(a, la, b, lb, set(subscripts.split("->")[1]), sizes)
    chosen = next(r for applies, r in numpy_einsum.pair_rules if applies(pair))
    assert chosen.__name__ == rule


def test_a_batched_matmul_is_a_map_of_matmuls() -> None:
    text = str(fold.trace(lambda a, b: np.einsum("bij,bjk->bik", a, b), *_operands([(2, 3, 4), (2, 4, 5)])))
    assert "map" in text and "matmul" in text


@pytest.mark.parametrize("f,message", [
    (lambda x: np.einsum("ij,jk->ik", x), r"np\.einsum\('ij,jk->ik'\): 2 operand terms but 1 operands"),
    (lambda x: np.einsum("ijk->i", x), r"term 0 'ijk' names 3 axes, but the operand has 2 \(write '\.\.\.' for the rest\)"),
    (lambda x: np.einsum("i->i", x), r"term 0 'i' names 1 axes, but the operand has 2"),
    (lambda x: np.einsum("ij,ij->i", x, x[:2]), r"'i' has length 3 in one place and 2 in another \(operand shapes \[\(3, 4\), \(2, 4\)\]\)"),
    (lambda x: np.einsum("ij->k", x), r"the output 'k' has \['k'\], which no operand has"),
    (lambda x: np.einsum("ij->ii", x), r"the output 'ii' repeats \['i'\]"),
    (lambda x: np.einsum("i1->i", x), r"term 0 'i1' has \['1'\], which are not letters"),
    (lambda x: np.einsum("...j->j", x), r"the operands have 1 axes under '\.\.\.', which the output 'j' must keep"),
    (lambda x: np.einsum("ii->i", x), r"np\.einsum\('ii->i'\): 'i' has length 3 in one place and 4 in another"),
    (lambda x: np.einsum("ii->i", x[:1]), r"the repeated label 'i' has lengths \[1, 4\]"),
    (lambda x: np.einsum(x, [0, 1], [1]), r"takes the subscripts as a string first"),
    (lambda x: np.einsum("ij->i", x, out=np.zeros(3)), r"np\.einsum\(\.\.\., out=\.\.\.\)"),
])
def test_bad_subscripts_are_named(f, message) -> None:
    with pytest.raises(fold.FoldError, match=message):
        fold.trace(f, RNG.normal(size=(3, 4)))
