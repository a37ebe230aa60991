"""How the user states a split: per positional argument, the axis its leaves are split along, and the
chunk sizes along it (a count of even chunks, or the sizes themselves, as dask.array's `chunks`)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from fold.errors import FoldError
from fold.pytree import tree_flatten


class ShardingError(FoldError, ValueError):
    """A split the program cannot run sharded (the statement and axis are named), or a bad split spec."""


Chunks = "int | Sequence[int]"


def even_chunks(n: int, count: int) -> tuple[int, ...]:
    """`n` rows in `count` chunks whose sizes differ by at most one (empty chunks dropped: one is kept)."""
    count = max(1, min(int(count), n)) if n else 1
    base, extra = divmod(n, count)
    return tuple(base + (i < extra) for i in range(count))


def chunk_sizes(where: str, n: int, chunks: Any) -> tuple[int, ...]:
    """The chunk sizes of an axis of length `n` from an int (how many even chunks) or explicit sizes."""
    if isinstance(chunks, bool):
        raise ShardingError(f"{where}: chunks must be a positive int or a sequence of sizes, got {chunks!r}")
    if isinstance(chunks, int):
        if chunks < 1:
            raise ShardingError(f"{where}: chunks must be at least 1, got {chunks}")
        return even_chunks(n, chunks)
    sizes = tuple(int(c) for c in chunks)
    if not sizes or any(c < 0 for c in sizes) or sum(sizes) != n:
        raise ShardingError(f"{where}: chunk sizes {sizes} must be non-negative and sum to the axis length {n}")
    nonempty = tuple(c for c in sizes if c) or (0,)
    return nonempty


def leaf_splits(args: tuple, split: Mapping[int, int], chunks: Any, default_count: int) -> list[tuple[int, tuple[int, ...]] | None]:
    """Per flat leaf of `args`: (axis, chunk sizes) if it is split, else None (it is replicated).

    `split` maps a positional argument to the axis all its leaves are split along; `chunks` is one spec for
    every split argument or a dict argument -> spec; `default_count` (the number of workers) when None.
    """
    for num, axis in split.items():
        if not isinstance(num, int) or not -len(args) <= num < len(args):
            raise ShardingError(f"fold.shard: split names argument {num!r}, but {len(args)} arguments were given")
        if not isinstance(axis, int) or isinstance(axis, bool):
            raise ShardingError(f"fold.shard: the axis of argument {num} must be an int, got {axis!r}")
    normalised = {num % len(args): axis for num, axis in split.items()}
    out: list = []
    for num, arg in enumerate(args):
        leaves = tree_flatten(arg)[0]
        if num not in normalised:
            out += [None] * len(leaves)
            continue
        spec = chunks.get(num, default_count) if isinstance(chunks, Mapping) else (default_count if chunks is None else chunks)
        for leaf in leaves:
            shape = getattr(leaf, "shape", ())
            axis = normalised[num]
            if not -len(shape) <= axis < len(shape):
                raise ShardingError(f"fold.shard: argument {num} has shape {tuple(shape)}; it has no axis {axis} to split")
            axis %= len(shape)
            out.append((axis, chunk_sizes(f"fold.shard: argument {num}", shape[axis], spec)))
    return out


def as_split_dict(split: Any) -> dict[int, int]:
    """`split` as {argument: axis}: None splits argument 0 along axis 0 (data parallel)."""
    if split is None:
        return {0: 0}
    if not isinstance(split, Mapping):
        raise ShardingError(f"fold.shard: split must be a dict {{argument: axis}}, got {type(split).__name__}")
    return dict(split)

