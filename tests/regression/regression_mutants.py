"""Build deliberately broken copies of SGLang functions, so each regression check is shown to catch a regression.

A mutant is the installed function's own source with one fix taken out (a conjunct dropped, a statement removed,
two statements swapped), recompiled against the function's real module globals. That is a closer model of "a
later SGLang lost this fix" than a hand-written stand-in, and it follows the installed code as it changes.

Every mutation must change the tree: if the fix it removes cannot be found (SGLang rewrote the function), the
mutant builder raises, so the "detects the broken variant" test errors instead of passing vacuously.
"""

from __future__ import annotations

import __future__
import ast
import inspect
import textwrap
from typing import Callable

import pytest

from sglang_glm_ext.patching.ledger import raw_attr, unwrap


class MutationNotApplied(AssertionError):
    """The code the mutation targets is not in the installed function any more; update the test."""


def mutant(owner, name: str, transformer: ast.NodeTransformer):
    """The attribute `owner.name` rebuilt from its source with `transformer` applied.

    Returns the object to monkeypatch onto `owner` (a classmethod stays a classmethod: its decorators are in the
    source and are re-applied). The transformer must set `self.applied = True` when it changed something.
    """
    # Hook wrappers and decorators (contextmanager) are unwrapped: the mutant is built from the source as written.
    func = unwrap(raw_attr(owner, name))
    src = textwrap.dedent(inspect.getsource(func))
    tree = ast.parse(src)
    # Keep the installed file's line numbers, so a traceback through a mutant points at the real source lines.
    ast.increment_lineno(tree, func.__code__.co_firstlineno - 1)
    transformer.applied = False
    tree = ast.fix_missing_locations(transformer.visit(tree))
    if not transformer.applied:
        raise MutationNotApplied(f"{type(transformer).__name__} found nothing to break in {func.__qualname__}")
    flags = 0
    if getattr(inspect.getmodule(func), "annotations", None) is __future__.annotations:
        flags |= __future__.annotations.compiler_flag
    code = compile(tree, inspect.getsourcefile(func) or "<mutant>", "exec", flags=flags, dont_inherit=True)
    local_ns: dict = {}
    # The module's real globals: names the function looks up at call time (which tests may monkeypatch) resolve
    # exactly as they do for the original; the def itself lands in local_ns, not in the module.
    exec(code, func.__globals__, local_ns)
    return local_ns[func.__name__]


def check_catches_mutant(monkeypatch, owner, name: str, transformer: ast.NodeTransformer, check: Callable,
                         *args, **kwargs) -> None:
    """Patch the mutant of `owner.name` in, then require `check(*args, **kwargs)` to fail with AssertionError.

    The one "build the broken variant, patch it in, expect the check to catch it" step of every regression module:
    a check that passes on the mutant proves nothing, so that is a test failure here.
    """
    # mutant() raises MutationNotApplied (an AssertionError) outside the raises block: a mutation that finds
    # nothing to break errors the test instead of passing it.
    monkeypatch.setattr(owner, name, mutant(owner, name, transformer))
    with pytest.raises(AssertionError):
        check(*args, **kwargs)


def _mentions(node: ast.AST, needle: str) -> bool:
    return needle in ast.unparse(node)


class DropConjunct(ast.NodeTransformer):
    """In `a and b and c`, drop every operand whose source mentions `needle` (e.g. a guard that was added)."""

    def __init__(self, needle: str, op=ast.And):
        self.needle, self.op = needle, op

    def visit_BoolOp(self, node: ast.BoolOp):
        self.generic_visit(node)
        if not isinstance(node.op, self.op):
            return node
        kept = [v for v in node.values if not _mentions(v, self.needle)]
        if len(kept) == len(node.values) or not kept:
            return node
        self.applied = True
        return kept[0] if len(kept) == 1 else ast.BoolOp(op=node.op, values=kept)


class DropStatements(ast.NodeTransformer):
    """Remove every simple statement whose source contains `needle` (or, with exact=True, is exactly `needle`)."""

    def __init__(self, needle: str, only: Callable[[ast.stmt], bool] = lambda s: True, exact: bool = False):
        self.needle, self.only, self.exact = needle, only, exact

    def _matches(self, stmt) -> bool:
        return ast.unparse(stmt).strip() == self.needle if self.exact else _mentions(stmt, self.needle)

    def _filter(self, body):
        out = []
        for stmt in body:
            if (
                not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef))
                and not _is_compound(stmt)
                and self.only(stmt)
                and self._matches(stmt)
            ):
                self.applied = True
                continue
            out.append(stmt)
        return out or [ast.Pass()]

    def generic_visit(self, node):
        super().generic_visit(node)
        for field in ("body", "orelse", "finalbody"):
            body = getattr(node, field, None)
            if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
                setattr(node, field, self._filter(body))
        return node


def _is_compound(stmt: ast.stmt) -> bool:
    # Only simple statements are dropped; a compound one (if/for/with/try) is descended into instead, so a needle
    # inside a big block removes the one line that carries it, not the block.
    return isinstance(stmt, (ast.If, ast.For, ast.While, ast.With, ast.Try, ast.AsyncWith, ast.AsyncFor))


class DropIfBlocks(ast.NodeTransformer):
    """Remove whole `if` statements whose test's source contains `needle`."""

    def __init__(self, needle: str):
        self.needle = needle

    def visit_If(self, node: ast.If):
        self.generic_visit(node)
        if _mentions(node.test, self.needle) and not node.orelse:
            self.applied = True
            return None
        return node

    def generic_visit(self, node):
        node = super().generic_visit(node)
        for field in ("body", "orelse", "finalbody"):
            body = getattr(node, field, None)
            if isinstance(body, list) and not body and field == "body":
                setattr(node, field, [ast.Pass()])
        return node


class SwapIfBlocks(ast.NodeTransformer):
    """Swap two sibling `if` statements whose tests mention `first` and `second` (an ordering regression)."""

    def __init__(self, first: str, second: str):
        self.first, self.second = first, second

    def generic_visit(self, node):
        node = super().generic_visit(node)
        body = getattr(node, "body", None)
        if isinstance(body, list):
            idx = {}
            for i, stmt in enumerate(body):
                if isinstance(stmt, ast.If):
                    for key in (self.first, self.second):
                        if key not in idx and _mentions(stmt.test, key):
                            idx[key] = i
            if len(idx) == 2:
                i, j = idx[self.first], idx[self.second]
                body[i], body[j] = body[j], body[i]
                self.applied = True
        return node


class DropCallKeyword(ast.NodeTransformer):
    """Drop keyword argument `keyword` from every call that passes it (the callee's default takes over)."""

    def __init__(self, keyword: str):
        self.keyword = keyword

    def visit_Call(self, node: ast.Call):
        self.generic_visit(node)
        kept = [k for k in node.keywords if k.arg != self.keyword]
        if len(kept) != len(node.keywords):
            node.keywords = kept
            self.applied = True
        return node


class UnwrapMethodCall(ast.NodeTransformer):
    """Replace `x.method(<args mentioning needle>)` by `x` (e.g. drop a `.to(torch.int64)` cast)."""

    def __init__(self, method: str, needle: str = ""):
        self.method, self.needle = method, needle

    def visit_Call(self, node: ast.Call):
        self.generic_visit(node)
        if (
            isinstance(node.func, ast.Attribute)
            and node.func.attr == self.method
            and all(_mentions(a, self.needle) for a in node.args[:1])
        ):
            self.applied = True
            return node.func.value
        return node


class DropFinally(ast.NodeTransformer):
    """Empty every `finally:` block (a cleanup that no longer runs)."""

    def visit_Try(self, node: ast.Try):
        self.generic_visit(node)
        if node.finalbody:
            node.finalbody = []
            self.applied = True
            if not node.handlers:  # `try:` needs an except or finally; keep the body's behaviour
                return node.body
        return node
