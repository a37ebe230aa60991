"""Bad input to the AD entry points: each gets a fold.FoldError subclass whose message names the problem."""

from __future__ import annotations

import re

import numpy as np
import pytest

import fold

X = np.array([0.5, -1.0, 2.0])


def square(x):
    return x * x


def pair(x):
    return x * 2.0, fold.sum(x)


# ------------------------------------------------------------------------------------------ cotangents


def test_cotangent_of_the_wrong_shape_names_both_shapes() -> None:
    with pytest.raises(fold.ShapeError, match=re.escape("shape (4,), expected (3,)")):
        fold.vjp(square, X)[1](np.ones(4))
    with pytest.raises(fold.ShapeError, match=re.escape("shape (), expected (3,)")):
        fold.vjp(square, X)[1](1.0)


def test_cotangent_of_the_wrong_dtype_names_both_dtypes() -> None:
    with pytest.raises(fold.FoldTypeError, match="float32, expected float64"):
        fold.vjp(square, X)[1](np.ones(3, np.float32))
    with pytest.raises(fold.FoldTypeError, match="int64, expected float64"):
        fold.vjp(square, X)[1](np.ones(3, np.int64))


def test_a_python_number_is_a_fine_scalar_cotangent() -> None:
    (ct,) = fold.vjp(lambda x: fold.sum(x * x), X)[1](2.0)
    np.testing.assert_allclose(ct, 4.0 * X)


def test_cotangent_of_the_wrong_structure() -> None:
    with pytest.raises(fold.StructureError, match="cotangent has structure"):
        fold.vjp(pair, X)[1](np.ones(3))
    with pytest.raises(fold.StructureError, match="cotangent has structure"):
        fold.vjp(pair, X)[1]([np.ones(3), 1.0])  # a list where the output is a tuple
    with pytest.raises(fold.ShapeError, match=re.escape(r"cotangent[1] has shape (3,), expected ()")):
        fold.vjp(pair, X)[1]((np.ones(3), np.ones(3)))
    with pytest.raises(fold.StructureError):
        fold.vjp(lambda x: {"a": x}, X)[1]({"b": np.ones(3)})


def test_tangents_that_do_not_match_the_primals() -> None:
    with pytest.raises(fold.ShapeError, match=re.escape("shape (2,), expected (3,)")):
        fold.jvp(square, (X,), (np.ones(2),))[1]
    with pytest.raises(fold.StructureError):
        fold.jvp(square, (X,), (np.ones(3), np.ones(3)))[1]
    with pytest.raises(fold.FoldTypeError, match="tuple"):
        fold.jvp(square, (X,), np.ones(3))[1]
    with pytest.raises(fold.FoldTypeError, match="tuple or list"):
        fold.jvp(square, X, (np.ones(3),))
    y, ydot = fold.jvp(square, [X], [np.ones(3)])  # a list of primals, as in JAX
    np.testing.assert_allclose(ydot, 2 * X)


def test_a_nonzero_tangent_or_cotangent_of_an_integer_value_is_an_error() -> None:
    """Integers have no derivative, so a nonzero (co)tangent for one would be silently ignored; zeros are fine."""
    ints = np.arange(3)
    f = lambda x, i: (x * i, i + 1)  # noqa: E731
    with pytest.raises(fold.FoldTypeError, match=re.escape("fold.jvp: tangents[1] is nonzero, but its value is int64")):
        fold.jvp(f, (X, ints), (np.ones(3), np.ones(3)))[1]
    with pytest.raises(fold.FoldTypeError, match=re.escape("fold.vjp: cotangent[1] is nonzero, but its value is int64")):
        fold.vjp(f, X, ints)[1]((np.ones(3), np.ones(3, np.int64)))
    y, _ = fold.jvp(f, (X, ints), (np.ones(3), np.zeros(3, np.int64)))[1]
    np.testing.assert_array_equal(y, ints.astype(float))
    gx, _ = fold.vjp(f, X, ints)[1]((np.ones(3), np.zeros(3, np.int64)))
    np.testing.assert_array_equal(gx, ints.astype(float))


# ------------------------------------------------------------------------------------------ reduce_rule


@pytest.mark.parametrize("call", [
    lambda rule: fold.vjp(square, X, reduce_rule=rule)[1](np.ones(3)),
    lambda rule: fold.grad(lambda x: fold.sum(x * x), reduce_rule=rule)(X),
    lambda rule: fold.value_and_grad(lambda x: fold.sum(x * x), reduce_rule=rule)(X),
], ids=["vjp", "grad", "value_and_grad"])
@pytest.mark.parametrize("rule", ["specialised", "Generic", "", None])
def test_reduce_rule_must_be_one_of_three(call, rule) -> None:
    with pytest.raises(fold.FoldTypeError, match="reduce_rule must be one of 'auto', 'generic', 'monoid'") as info:
        call(rule)
    assert repr(rule) in str(info.value)


def test_monoid_rule_on_a_plain_operator_names_it() -> None:
    def my_operator(a, b):
        return a * b + a + b

    with pytest.raises(fold.FoldError, match="reduce_rule='monoid'.*my_operator.*not a fold.Monoid"):
        fold.vjp(lambda x: fold.reduce(my_operator, x, identity=0.0), X, reduce_rule="monoid")[1](1.0)


def test_monoid_rule_on_a_monoid_without_d_names_it() -> None:
    no_d = fold.Monoid(lambda a, b: a + b, 0.0, commutative=True, name="plain_sum")
    with pytest.raises(fold.FoldError, match="reduce_rule='monoid'.*plain_sum.*no d"):
        fold.vjp(lambda x: fold.reduce(no_d, x), X, reduce_rule="monoid")[1](1.0)
    with pytest.raises(fold.FoldError, match="plain_sum"):
        fold.grad(lambda x: fold.reduce_by_index(no_d, 2, np.array([0, 1, 1]), x)[1], reduce_rule="monoid")(X)


def test_monoid_rule_on_a_non_commutative_monoid_names_it() -> None:
    affine = fold.Monoid(lambda f, g: (f[0] * g[0], g[0] * f[1] + g[1]), (1.0, 0.0), commutative=False,
                         d=lambda c, a, g: g, name="affine_maps")
    with pytest.raises(fold.FoldError, match="reduce_rule='monoid'.*affine_maps.*not commutative"):
        fold.vjp(lambda a, b: fold.reduce(affine, (a, b))[1], X, X, reduce_rule="monoid")[1](1.0)


def test_monoid_rule_error_inside_a_map_body() -> None:
    no_d = fold.Monoid(lambda a, b: fold.maximum(a, b), -np.inf, commutative=True, name="max_without_d")
    with pytest.raises(fold.FoldError, match="max_without_d"):
        fold.vjp(lambda m: fold.map(lambda r: fold.reduce(no_d, r), m), np.ones((2, 3)), reduce_rule="monoid")[1](np.ones(2))


# ------------------------------------------------------------------------------------------ grad


def test_grad_with_argnums_at_an_integer_argument() -> None:
    f = lambda x, n: fold.sum(x * fold.convert(n, "float64"))  # noqa: E731
    with pytest.raises(fold.FoldTypeError, match="int64.*only float arguments can be differentiated"):
        fold.grad(f, argnums=1)(X, np.arange(3))
    with pytest.raises(fold.FoldTypeError, match="argnums"):
        fold.grad(f, argnums=(0, 1))(X, np.arange(3))
    with pytest.raises(fold.FoldTypeError, match="bool"):
        fold.grad(lambda x, b: fold.sum(fold.where(b, x, 0.0)), argnums=1)(X, np.array([True, False, True]))
    np.testing.assert_allclose(fold.grad(f, argnums=0)(X, np.arange(3)), np.arange(3.0))


def test_grad_with_argnums_out_of_range() -> None:
    with pytest.raises(fold.FoldTypeError, match="argnums contains 2, but only 1 arguments"):
        fold.grad(lambda x: fold.sum(x), argnums=2)(X)


@pytest.mark.parametrize("f, what", [
    (lambda x: x * 2.0, "f64[3]"),
    (lambda x: (fold.sum(x), fold.sum(x)), "f64[], f64[]"),
    (lambda x: fold.convert(fold.sum(x) > 0, "int64"), "i64[]"),
    (lambda x: fold.sum(x) > 0, "bool[]"),
], ids=["vector", "tuple", "integer", "boolean"])
def test_grad_of_a_function_that_is_not_a_float_scalar(f, what: str) -> None:
    with pytest.raises(fold.FoldTypeError, match="must return one float scalar") as info:
        fold.grad(f)(X)
    assert what in str(info.value)
    with pytest.raises(fold.FoldTypeError, match="must return one float scalar"):
        fold.value_and_grad(f)(X)


def test_errors_are_fold_errors_not_numpy_tracebacks() -> None:
    """Every failure above is a FoldError raised before anything runs (nothing from NumPy leaks through)."""
    bad_calls = [
        lambda: fold.vjp(square, X)[1](np.ones((3, 1))),
        lambda: fold.vjp(square, X)[1]("not an array"),
        lambda: fold.jvp(square, (X,), (np.ones(3, np.int32),))[1],
        lambda: fold.grad(square)(X),
    ]
    for call in bad_calls:
        with pytest.raises(fold.FoldError):
            call()
