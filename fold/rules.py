"""Rule tables: one per transformation or backend, keyed by primitive type.

Every table refuses a second rule for the same primitive, and a missing rule is a `MissingRuleError` that
names the primitive and the table, never a KeyError.
"""

from __future__ import annotations

from typing import Callable, Iterable

from .errors import MissingRuleError


class RuleTable:
    """A registry `primitive type -> rule`, filled with the `register` decorator. A `default` rule, if given,
    is what `get` returns for a primitive without one of its own (a backend that must see every statement)."""

    def __init__(self, name: str, default: Callable | None = None):
        self.name = name
        self.default = default
        self._rules: dict[type, Callable] = {}

    def register(self, *prim_types: type) -> Callable[[Callable], Callable]:
        def decorate(rule: Callable) -> Callable:
            for prim_type in prim_types:
                if prim_type in self._rules:
                    raise ValueError(f"{self.name}: a rule for {prim_type.__name__} is already registered")
                self._rules[prim_type] = rule
            return rule

        return decorate

    def lookup(self, prim: object) -> Callable:
        rule = self._rules.get(type(prim))
        if rule is None:
            name = getattr(prim, "name", type(prim).__name__)
            raise MissingRuleError(f"no {self.name} rule for primitive '{name}' ({type(prim).__name__})")
        return rule

    def get(self, prim: object) -> Callable | None:
        """The rule for `prim`'s type, else the default (None if there is none): lookup without the error,
        for tables tried in turn."""
        return self._rules.get(type(prim), self.default)

    def __contains__(self, prim_type: type) -> bool:
        return prim_type in self._rules

    def covered(self) -> Iterable[type]:
        return self._rules.keys()


class MonoidTable:
    """A registry `monoid -> rule` by identity (monoids are values, compared as the objects they are), for
    what a construct does with particular monoids: gemm_map_reduce's block folds and pair rules."""

    def __init__(self, name: str):
        self.name = name
        self._rules: dict[int, tuple[object, Callable]] = {}

    def register(self, monoid: object) -> Callable[[Callable], Callable]:
        def decorate(rule: Callable) -> Callable:
            if id(monoid) in self._rules:
                raise ValueError(f"{self.name}: a rule for monoid {getattr(monoid, 'name', monoid)} is already registered")
            self._rules[id(monoid)] = (monoid, rule)  # the monoid is kept, so its id is never reused
            return rule

        return decorate

    def get(self, monoid: object) -> Callable | None:
        found = self._rules.get(id(monoid))
        return None if found is None else found[1]


def all_primitive_types() -> list[type]:
    """Every concrete primitive class of the language (for coverage tests of the rule tables)."""
    from . import primitives  # noqa: F401  (importing registers every primitive module)
    from .ir import Primitive

    found: list[type] = []
    stack = list(Primitive.__subclasses__())
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        if not getattr(cls, "abstract", False) and not getattr(cls, "backend_internal", False):
            found.append(cls)
    return sorted(set(found), key=lambda c: c.__name__)
