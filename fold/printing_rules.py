"""Print rules for primitives whose default `name[params] args` form reads badly."""

from __future__ import annotations

from .ir import Let
from .primitives import Elementwise, GemmBlockSum, GemmMapReduce, Loop, Map, Reduce, ReduceByIndex, Scan
from .printer import default_print, print_rules


@print_rules.register(Elementwise)
def _print_elementwise(stmt: Let, args: list[str]) -> str:
    symbol = stmt.prim.scalar.symbol
    if symbol and len(args) == 2:
        return f"{args[0]} {symbol} {args[1]}"
    return f"{stmt.prim.op} {' '.join(args)}"


def _captures(stmt: Let, args: list[str]) -> tuple[str, list[str]]:
    k = stmt.prim.num_consts
    return (f" [captures {', '.join(args[:k])}]" if k else ""), args[k:]


@print_rules.register(Map)
def _print_map(stmt: Let, args: list[str]) -> str:
    captures, rest = _captures(stmt, args)
    return f"map {' '.join(rest)}{captures}"


def _monoid_label(prim: object) -> str:
    monoid = getattr(prim, "monoid", None)
    return f"[{monoid.name}]" if monoid is not None else ""


@print_rules.register(Reduce, Scan)
def _print_fold(stmt: Let, args: list[str]) -> str:
    captures, rest = _captures(stmt, args)
    k = stmt.prim.num_leaves
    flags = [f for f in ("exclusive", "reverse") if getattr(stmt.prim, f, False)]
    flag_text = f" ({', '.join(flags)})" if flags else ""
    return f"{stmt.prim.name}{_monoid_label(stmt.prim)}{flag_text} ({', '.join(rest[:k])}) {' '.join(rest[k:])}{captures}"


@print_rules.register(ReduceByIndex)
def _print_rbi(stmt: Let, args: list[str]) -> str:
    captures, rest = _captures(stmt, args)
    k = stmt.prim.num_leaves
    return f"reduce_by_index{_monoid_label(stmt.prim)}[n={stmt.prim.n}] ({', '.join(rest[:k])}) {' '.join(rest[k:])}{captures}"


@print_rules.register(Loop)
def _print_loop(stmt: Let, args: list[str]) -> str:
    captures, rest = _captures(stmt, args)
    ck = f", checkpoint={stmt.prim.checkpoint}" if stmt.prim.checkpoint else ""
    return f"loop[n={stmt.prim.n}{ck}] {' '.join(rest)}{captures}"


__all__ = ["default_print"]


@print_rules.register(GemmMapReduce)
def _print_gemm(stmt: Let, args: list[str]) -> str:
    prim = stmt.prim
    captures, rest = _captures(stmt, args)
    k = prim.num_leaves
    ident, rest = rest[:k], rest[k:]
    row, col = rest[: prim.num_row_args], rest[prim.num_row_args:]
    operator = prim.monoid.name if prim.monoid is not None else "operator"  # a jvp's pair operator has no monoid
    return (f"gemm_map_reduce[{operator}, block={prim.block}] ({', '.join(ident)}) "
            f"rows: {' '.join(row)} | cols: {' '.join(col)}{captures}")


@print_rules.register(GemmBlockSum)
def _print_gemm_block_sum(stmt: Let, args: list[str]) -> str:
    prim = stmt.prim
    by_role = {role: [a for a, r in zip(args, prim.in_roles, strict=True) if r == role] for role in ("whole", "row", "col")}
    return (f"{prim.label}[block={prim.block}] whole: {' '.join(by_role['whole']) or '-'} "
            f"| rows: {' '.join(by_role['row'])} | cols: {' '.join(by_role['col'])}")
