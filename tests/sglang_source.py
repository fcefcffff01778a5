"""Reading the installed SGLang's source: which names it imports from a module (``sgl_kernel``) at module level on a
device's path. Shared by the CPU serving mode's and the GPU bring-up tier's stand-in contract tests."""

from __future__ import annotations

import ast
import pathlib
from typing import Mapping


def _eval(node, predicates: Mapping[str, bool]):
    """True / False where the test is decided by the device predicates alone, else None."""
    if isinstance(node, ast.Name):
        return predicates.get(node.id)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.args:
        return predicates.get(node.func.id)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        v = _eval(node.operand, predicates)
        return None if v is None else not v
    if isinstance(node, ast.BoolOp):
        vals = [_eval(v, predicates) for v in node.values]
        if isinstance(node.op, ast.And):
            return False if False in vals else (True if all(v is True for v in vals) else None)
        return True if True in vals else (False if all(v is False for v in vals) else None)
    return None


def device_path_imports(root: pathlib.Path, package: str, predicates: Mapping[str, bool]) -> dict[str, set[str]]:
    """{``package`` module: names} that SGLang imports at module level under device branches the machine
    ``predicates`` describes takes (every enclosing if/else decided, and at least one of them). Imports under try
    (SGLang falls back on an ImportError) and unconditional ones (modules of other devices' backends) are not that
    device's path."""
    found: dict[str, set[str]] = {}

    def walk(body, decided, in_try):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if isinstance(node, ast.If):
                v = _eval(node.test, predicates)
                if v is not False:
                    walk(node.body, decided + [v], in_try)
                if v is not True:
                    walk(node.orelse, decided + [None if v is None else True], in_try)
            elif isinstance(node, ast.Try):
                walk(node.body, decided, True)
            elif isinstance(node, ast.With):
                walk(node.body, decided, in_try)
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == package:
                if decided and all(d is True for d in decided) and not in_try:
                    found.setdefault(node.module, set()).update(a.name for a in node.names)

    for f in sorted(root.rglob("*.py")):
        rel = f.relative_to(root).as_posix()
        if "/test/" in f"/{rel}" or rel.startswith("multimodal_gen/"):
            continue
        try:
            tree = ast.parse(f.read_text())
        except (SyntaxError, UnicodeDecodeError):
            continue
        walk(tree.body, [], False)
    return found
