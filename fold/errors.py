"""One exception hierarchy for everything fold reports to a user.

Every error fold raises on purpose derives from `FoldError`, and also from the built-in exception a Python
user would expect (`ValueError` for a bad shape, `TypeError` for a bad dtype or value, ...), so that
`except ValueError` keeps working while `except fold.FoldError` catches them all.
"""

from __future__ import annotations


class FoldError(Exception):
    """Base class of every error fold raises on purpose."""


class ShapeError(FoldError, ValueError):
    """Arrays whose shapes do not fit the operation (both shapes are named in the message)."""


class FoldTypeError(FoldError, TypeError):
    """A value that is not an array or pytree, or a dtype an operation or backend does not support."""


class StructureError(FoldError, ValueError):
    """Two pytrees that should have the same structure (an operator's result and its arguments, ...) do not."""


class FoldIndexError(FoldError, IndexError):
    """An index out of range, found at trace time where it is static or at run time where it is not."""


class FoldAttributeError(FoldError, AttributeError):
    """A traced array was asked for an attribute it does not have (the message lists the ones it has)."""


class EscapedTracerError(FoldError):
    """A tracer was used outside the trace that created it (kept in a global and used afterwards, say)."""


class ConcretizationError(FoldError, TypeError):
    """A traced value was asked for a concrete Python value (`if x > 0:` on a tracer, `float(x)`, ...)."""


class MissingRuleError(FoldError, NotImplementedError):
    """A primitive has no rule for the transformation or backend asked for."""


class ProgramError(FoldError):
    """A Program that breaks the invariants `check_program` verifies (unbound variable, shape disagreement, ...)."""


class FoldRuntimeError(FoldError, RuntimeError):
    """A statement failed while a program ran; the message names the statement."""


class MonoidLawError(FoldError, ValueError):
    """A monoid broke one of its laws; `.report` holds the check that failed."""

    def __init__(self, message: str, report: object = None):
        super().__init__(message)
        self.report = report
