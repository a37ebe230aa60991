"""Pytrees: nested tuples, lists, dicts and NamedTuples of arrays, flattened to a list of leaves and a treedef.

As in JAX, an array of records is a record of arrays: a combinator applied to a pytree acts on each leaf,
and the treedef records how to put the leaves back together. Dict keys are sorted, so two dicts with the
same keys always flatten the same way.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

from .errors import StructureError

_NODE_KINDS = ("tuple", "list", "dict", "namedtuple", "none")


def _kind_of(value: Any) -> str | None:
    if value is None:
        return "none"
    if isinstance(value, tuple):
        return "namedtuple" if hasattr(type(value), "_fields") else "tuple"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "dict"
    return None


@dataclass(frozen=True)
class TreeDef:
    """The shape of a pytree without its leaves; hashable, so it can key a trace cache."""

    kind: str  # one of _NODE_KINDS, or "leaf"
    meta: Any = None  # dict keys, or the NamedTuple class
    children: tuple["TreeDef", ...] = ()

    @functools.cached_property
    def num_leaves(self) -> int:
        if self.kind == "leaf":
            return 1
        return sum(child.num_leaves for child in self.children)

    def unflatten(self, leaves: list | tuple) -> Any:
        if len(leaves) != self.num_leaves:
            raise StructureError(f"treedef {self} expects {self.num_leaves} leaves, got {len(leaves)}")
        if self.kind == "leaf":
            return leaves[0]
        value, rest = self._build(list(leaves))
        assert not rest
        return value

    def _build(self, leaves: list) -> tuple[Any, list]:
        if self.kind == "leaf":
            return leaves[0], leaves[1:]
        parts = []
        for child in self.children:
            part, leaves = child._build(leaves)
            parts.append(part)
        return _BUILDERS[self.kind](self.meta, parts), leaves

    def __str__(self) -> str:
        if self.kind == "leaf":
            return "*"
        if self.kind == "none":
            return "None"
        inner = ", ".join(str(c) for c in self.children)
        if self.kind == "dict":
            inner = ", ".join(f"{k!r}: {c}" for k, c in zip(self.meta, self.children, strict=True))
            return "{" + inner + "}"
        if self.kind == "namedtuple":
            return f"{self.meta.__name__}({inner})"
        if self.kind == "list":
            return f"[{inner}]"
        return f"({inner}{',' if len(self.children) == 1 else ''})"


_BUILDERS: dict[str, Callable[[Any, list], Any]] = {
    "tuple": lambda meta, parts: tuple(parts),
    "list": lambda meta, parts: list(parts),
    "dict": lambda meta, parts: dict(zip(meta, parts, strict=True)),
    "namedtuple": lambda meta, parts: meta(*parts),
    "none": lambda meta, parts: None,
}

LEAF = TreeDef("leaf")


def tree_flatten(tree: Any) -> tuple[list, TreeDef]:
    """Leaves in a fixed order, and the treedef that puts them back."""
    leaves: list = []
    treedef = _flatten_into(tree, leaves)
    return leaves, treedef


def _flatten_into(tree: Any, leaves: list) -> TreeDef:
    kind = _kind_of(tree)
    if kind is None:
        leaves.append(tree)
        return LEAF
    if kind == "none":
        return TreeDef("none")
    if kind == "dict":
        keys = tuple(sorted(tree.keys(), key=repr))
        return TreeDef("dict", keys, tuple(_flatten_into(tree[k], leaves) for k in keys))
    meta = type(tree) if kind == "namedtuple" else None
    return TreeDef(kind, meta, tuple(_flatten_into(child, leaves) for child in tree))


def tree_unflatten(treedef: TreeDef, leaves: list | tuple) -> Any:
    return treedef.unflatten(leaves)


def tree_map(fn: Callable, tree: Any, *rest: Any) -> Any:
    """Apply `fn` leaf by leaf to trees of the same structure."""
    leaves, treedef = tree_flatten(tree)
    other_leaves = []
    for other in rest:
        o_leaves, o_def = tree_flatten(other)
        if o_def != treedef:
            raise StructureError(f"tree_map: structures differ: {treedef} vs {o_def}")
        other_leaves.append(o_leaves)
    return treedef.unflatten([fn(*args) for args in zip(leaves, *other_leaves, strict=True)])


def leaf_paths(treedef: TreeDef, prefix: str = "") -> list[str]:
    """A readable path per leaf (`[0]['v']`), for error messages that must say which leaf is wrong."""
    if treedef.kind == "leaf":
        return [prefix or "<root>"]
    if treedef.kind == "dict":
        labels = [f"[{k!r}]" for k in treedef.meta]
    elif treedef.kind == "namedtuple":
        labels = [f".{name}" for name in treedef.meta._fields]
    else:
        labels = [f"[{i}]" for i in range(len(treedef.children))]
    paths: list[str] = []
    for label, child in zip(labels, treedef.children, strict=True):
        paths.extend(leaf_paths(child, prefix + label))
    return paths
