"""`np.einsum` on traced arrays, lowered to fold's products: transposes, reshapes, `fold.sum`, broadcasting
multiplies, 2-d matmuls and a `fold.map` of matmuls over batch axes. Nothing here has a derivative rule of
its own: grad, vjp and jvp go through those primitives.

The subscripts are parsed into one tuple of labels per operand (a letter, or for the axes an ellipsis
stands for a negative int counted from the right, so that ellipses broadcast against each other as NumPy's
do). Then, as NumPy's own einsum does in principle:

1. an operand with a repeated label ('ii', 'iij') keeps only its diagonal (a gather of static rows);
2. an axis of length 1 whose label is longer elsewhere is dropped (it broadcasts);
3. the operands are contracted left to right, a pair at a time: a label neither operand's partner nor any
   later operand nor the output needs is summed away first; the labels the pair share and later operands
   or the output need are batch axes, the other shared ones are contracted (`pair_rules` picks the product);
4. the result is transposed into the output's order.

Left to right is not the cheapest order for three or more operands (np.einsum_path's job); `optimize=` is
accepted and ignored, as the values do not depend on it.
"""

from __future__ import annotations

import string
from typing import Any, Callable, Sequence

import numpy as np

from . import ops
from .combinators import map as fold_map
from .errors import FoldTypeError, ShapeError
from .numpy_functions import _handles

Label = str | int  # a letter, or an ellipsis axis (-1 the last)
Labels = tuple[Label, ...]


def _parse_term(term: str, ndim: int, subscripts: str, which: str) -> Labels:
    """The labels of one operand's term: its letters, with '...' standing for the axes left over."""
    if term.count("...") > 1 or "." in term.replace("...", ""):
        raise FoldTypeError(f"np.einsum({subscripts!r}): {which} {term!r} has a '.' that is not one '...'")
    head, dots, tail = term.partition("...")
    bad = sorted({c for c in head + tail if c not in string.ascii_letters})
    if bad:
        raise FoldTypeError(f"np.einsum({subscripts!r}): {which} {term!r} has {bad}, which are not letters")
    extra = ndim - len(head) - len(tail)
    if extra < 0 or (extra and not dots):
        raise ShapeError(f"np.einsum({subscripts!r}): {which} {term!r} names {len(head) + len(tail)} axes, but the "
                         f"operand has {ndim}" + ("" if dots else " (write '...' for the rest)"))
    return (*head, *range(-extra, 0), *tail)


def parse(subscripts: str, shapes: Sequence[tuple[int, ...]]) -> tuple[list[Labels], Labels]:
    """The labels of each operand and of the output (implicit mode: the ellipsis axes, then the letters
    that occur once, in ASCII order, as NumPy)."""
    spec = subscripts.replace(" ", "")
    inputs, arrow, output = spec.partition("->")
    terms = inputs.split(",")
    if len(terms) != len(shapes):
        raise ShapeError(f"np.einsum({subscripts!r}): {len(terms)} operand terms but {len(shapes)} operands")
    labels = [_parse_term(t, len(s), subscripts, f"term {i}") for i, (t, s) in enumerate(zip(terms, shapes, strict=True))]
    width = max((-min([0, *[lb for lb in ls if isinstance(lb, int)]]) for ls in labels), default=0)
    letters = [lb for ls in labels for lb in ls if isinstance(lb, str)]
    if not arrow:
        return labels, (*range(-width, 0), *sorted(c for c in set(letters) if letters.count(c) == 1))
    out = _parse_term(output, len(output.replace("...", "")) + (width if "..." in output else 0), subscripts, "output")
    if width and "..." not in output:
        raise ShapeError(f"np.einsum({subscripts!r}): the operands have {width} axes under '...', which the output "
                         f"{output!r} must keep (write '...' in it)")
    repeated = sorted({c for c in out if out.count(c) > 1})
    unknown = sorted({c for c in out if isinstance(c, str) and c not in letters})
    if repeated or unknown:
        raise ShapeError(f"np.einsum({subscripts!r}): the output {output!r} "
                         + (f"repeats {repeated}" if repeated else f"has {unknown}, which no operand has"))
    return labels, out


def _sizes(labels: list[Labels], shapes: Sequence[tuple[int, ...]], subscripts: str) -> dict[Label, int]:
    """Each label's length: one length per label, or 1 broadcast against it."""
    sizes: dict[Label, int] = {}
    for ls, shape in zip(labels, shapes, strict=True):
        for label, n in zip(ls, shape, strict=True):
            known = sizes.get(label, 1)
            if n != known and 1 not in (n, known):
                name = repr(label) if isinstance(label, str) else f"the ellipsis axis {label}"
                raise ShapeError(f"np.einsum({subscripts!r}): {name} has length {known} in one place and {n} in "
                                 f"another (operand shapes {[tuple(s) for s in shapes]})")
            sizes[label] = n if known == 1 else known
    return sizes


def _diagonal(x: Any, labels: Labels) -> tuple[Any, Labels]:
    """`x` with each repeated label's axes replaced by their diagonal (np.einsum('ii->i')), as one gather."""
    for label in dict.fromkeys(labels):
        axes = [i for i, lb in enumerate(labels) if lb == label]
        if len(axes) < 2:
            continue
        shape = ops.shape_of(x)
        n = shape[axes[0]]
        if any(shape[i] != n for i in axes):
            raise ShapeError(f"np.einsum: the repeated label {label!r} has lengths {[shape[i] for i in axes]} in one "
                             f"operand (shape {shape}); a diagonal needs one length")
        rest = [i for i in range(len(shape)) if i not in axes]
        flat = ops.reshape(ops.transpose(x, (*axes, *rest)), (n ** len(axes), *[shape[i] for i in rest]))
        rows = np.ravel_multi_index((np.arange(n),) * len(axes), (n,) * len(axes)).astype(np.int64)
        x, labels = ops.getitem(flat, rows), (label, *[labels[i] for i in rest])
    return x, labels


def _drop_broadcast(x: Any, labels: Labels, sizes: dict[Label, int]) -> tuple[Any, Labels]:
    """`x` without its length-1 axes whose label is longer in another operand (they broadcast)."""
    shape = ops.shape_of(x)
    kept = [i for i, (lb, n) in enumerate(zip(labels, shape, strict=True)) if not (n == 1 and sizes[lb] != 1)]
    if len(kept) == len(shape):
        return x, labels
    return ops.reshape(x, tuple(shape[i] for i in kept)), tuple(labels[i] for i in kept)


def _sum_out(x: Any, labels: Labels, needed: set[Label]) -> tuple[Any, Labels]:
    axes = tuple(i for i, lb in enumerate(labels) if lb not in needed)
    return (ops.sum(x, axes), tuple(lb for lb in labels if lb in needed)) if axes else (x, labels)


def _arrange(x: Any, labels: Labels, order: Sequence[Label]) -> Any:
    """`x` transposed so that its axes follow `order` (which holds exactly its labels)."""
    perm = tuple(labels.index(lb) for lb in order)
    return x if perm == tuple(range(len(perm))) else ops.transpose(x, perm)


def _size(sizes: dict[Label, int], labels: Sequence[Label]) -> int:
    return int(np.prod([sizes[lb] for lb in labels], dtype=np.int64))


class Pair:
    """Two operands to contract: the labels they share and keep (batch), share and sum (contracted), and
    their own (free), with every label's length."""

    def __init__(self, a: Any, la: Labels, b: Any, lb: Labels, keep: set[Label], sizes: dict[Label, int]):
        self.a, self.b, self.sizes = a, b, sizes
        self.la, self.lb = la, lb
        self.batch = [x for x in la if x in lb and x in keep]
        self.contracted = [x for x in la if x in lb and x not in keep]
        self.free_a = [x for x in la if x not in lb]
        self.free_b = [x for x in lb if x not in la]

    def dims(self, labels: Sequence[Label]) -> tuple[int, ...]:
        return tuple(self.sizes[x] for x in labels)


# The products a pair contraction can be, special cases first: each takes the Pair and returns the result
# with axes (batch, free_a, free_b)
def _matmul_2d(p: Pair) -> Any:
    """No batch axes: (Fa, K) @ (K, Fb), the free axes of each operand merged into one."""
    a = ops.reshape(_arrange(p.a, p.la, p.free_a + p.contracted), (_size(p.sizes, p.free_a), _size(p.sizes, p.contracted)))
    b = ops.reshape(_arrange(p.b, p.lb, p.contracted + p.free_b), (_size(p.sizes, p.contracted), _size(p.sizes, p.free_b)))
    return ops.reshape(ops.matmul(a, b), p.dims(p.free_a + p.free_b))


def _broadcast_product(p: Pair) -> Any:
    """sum_k a[batch, fa, 1, k] * b[batch, 1, fb, k]: the product is no larger than an operand when one side
    has no free axes or nothing is contracted."""
    ones_a, ones_b = (1,) * len(p.free_a), (1,) * len(p.free_b)
    a = ops.reshape(_arrange(p.a, p.la, p.batch + p.free_a + p.contracted),
                    p.dims(p.batch + p.free_a) + ones_b + p.dims(p.contracted))
    b = ops.reshape(_arrange(p.b, p.lb, p.batch + p.free_b + p.contracted),
                    p.dims(p.batch) + ones_a + p.dims(p.free_b + p.contracted))
    product = ops.multiply(a, b)
    first = len(p.batch) + len(p.free_a) + len(p.free_b)
    return ops.sum(product, tuple(range(first, first + len(p.contracted)))) if p.contracted else product


def _batched_matmul(p: Pair) -> Any:
    """A fold.map over the merged batch axes of (Fa, K) @ (K, Fb)."""
    nb, fa, k, fb = (_size(p.sizes, g) for g in (p.batch, p.free_a, p.contracted, p.free_b))
    a = ops.reshape(_arrange(p.a, p.la, p.batch + p.free_a + p.contracted), (nb, fa, k))
    b = ops.reshape(_arrange(p.b, p.lb, p.batch + p.contracted + p.free_b), (nb, k, fb))
    return ops.reshape(fold_map(ops.matmul, a, b), p.dims(p.batch + p.free_a + p.free_b))


def _no_batch(p: Pair) -> bool:
    return not p.batch


def _small_product(p: Pair) -> bool:
    return not p.contracted or not p.free_a or not p.free_b


def _always(p: Pair) -> bool:
    return True


pair_rules: list[tuple[Callable[[Pair], bool], Callable[[Pair], Any]]] = [
    (_no_batch, _matmul_2d),
    (_small_product, _broadcast_product),
    (_always, _batched_matmul),
]


def contract(a: Any, la: Labels, b: Any, lb: Labels, keep: set[Label], sizes: dict[Label, int]) -> tuple[Any, Labels]:
    """The product of two labelled operands, summed over the shared labels not in `keep`."""
    a, la = _sum_out(a, la, keep | set(lb))
    b, lb = _sum_out(b, lb, keep | set(la))
    pair = Pair(a, la, b, lb, keep, sizes)
    rule = next(rule for applies, rule in pair_rules if applies(pair))
    return rule(pair), tuple(pair.batch + pair.free_a + pair.free_b)


def einsum(subscripts: str, operands: Sequence[Any]) -> Any:
    """np.einsum(subscripts, *operands) as fold operations (see the module's docstring)."""
    values = [ops.as_value(x, "np.einsum") for x in operands]
    shapes = [ops.shape_of(v) for v in values]
    labels, out = parse(subscripts, shapes)
    sizes = _sizes(labels, shapes, subscripts)
    terms = [_drop_broadcast(*_diagonal(v, ls), sizes) for v, ls in zip(values, labels, strict=True)]
    acc, acc_labels = _sum_out(*terms[0], set(out) | {lb for _, ls in terms[1:] for lb in ls})
    for i, (b, lb) in enumerate(terms[1:], start=1):
        keep = set(out) | {x for _, ls in terms[i + 1:] for x in ls}
        acc, acc_labels = contract(acc, acc_labels, b, lb, keep, sizes)
    acc, acc_labels = _sum_out(acc, acc_labels, set(out))
    return _arrange(acc, acc_labels, out)


@_handles(np.einsum)
def _einsum(*operands, out=None, dtype=None, order="K", casting="safe", optimize=False):
    """Products and sums by subscripts ('ij,jk->ik', implicit mode, '...', diagonals), as matmuls, broadcast
    multiplies and sums; `optimize=` and `order=` do not change the values and are ignored."""
    if out is not None:
        raise FoldTypeError("np.einsum(..., out=...) on a traced array: fold values are never written in place; "
                            "use the returned value")
    if not operands or not isinstance(operands[0], str):
        raise FoldTypeError("np.einsum on traced arrays takes the subscripts as a string first "
                            "(np.einsum('ij,jk->ik', a, b)), not the interleaved form np.einsum(a, [0, 1], b, [1, 2])")
    subscripts, arrays = operands[0], operands[1:]
    if dtype is not None:
        arrays = tuple(ops.convert(x, dtype) for x in arrays)
    return einsum(subscripts, arrays)
