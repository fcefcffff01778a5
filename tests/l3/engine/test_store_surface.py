"""The store's handle has one listed face (``store.SURFACE``) and no forwarding: tools, benches, tests and the rest
of the package read only that face on an ``L3Store``, and no private attribute of a store object, outside the files
that own the store (``sglang_glm_ext/l3/engine/``, and the bench's engine adapter ``tools/bench_engine.py``, which
reads an older engine's privates for benchmark/l3_ab.py on purpose).

How a store is recognised (read with ``ast``, per function scope, a nested scope inheriting its outer names unless
it binds them again): a name bound to ``L3Store.open(...)`` (also through ``with ... as``), or to a call of a
module-level helper that returns one (``return L3Store.open(...)`` or annotated ``-> L3Store``); a parameter
annotated ``L3Store``; the ``store`` fixture (any name ``store``); any ``<expr>.store`` (the HiCache backend's
handle) and a name bound to one. A shared store: ``<expr>.shared``, ``L3Store.find_open(...)`` and names bound to
them. Limits: a handle passed to a helper under another parameter name without an annotation, kept in a container,
or bound by tuple unpacking is not followed; a name bound both to a store and to something else in one scope is not
taken for a store (so its reads are not checked; ``= None`` before an open does not count); an attribute set or
deleted counts as a read, and so does ``getattr`` with a constant name.
"""

import ast
import pathlib

import pytest

from sglang_glm_ext.l3.engine import store as store_mod
from sglang_glm_ext.l3.engine.store import PENDING, SURFACE, L3Store

REPO = pathlib.Path(__file__).resolve().parents[3]
SCANNED = ("tests", "benchmark", "sglang_glm_ext")
OWNERS = ("sglang_glm_ext/l3/engine/", "sglang_glm_ext/l3/tools/bench_engine.py")
# What may be read on a SharedStore outside its owners: the reference count and state the sharing tests check.
SHARED_SURFACE = frozenset({"refs", "closed", "ns", "config"})

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def _call_name(node) -> str:
    f = node.func if isinstance(node, ast.Call) else None
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
        return f"{f.value.id}.{f.attr}"
    if isinstance(f, ast.Attribute):
        return f".{f.attr}"
    return f.id if isinstance(f, ast.Name) else ""


def _own_nodes(scope):
    """The nodes of a scope, not descending into nested function scopes."""
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        n = todo.pop()
        yield n
        if not isinstance(n, _SCOPES):
            todo.extend(ast.iter_child_nodes(n))


def _bindings(scope) -> dict[str, list]:
    """Every name bound in the scope -> the values bound to it (None: bound by a loop, an unpacking, an import...)."""
    out: dict[str, list] = {}
    if isinstance(scope, _SCOPES):
        for a in scope.args.args + scope.args.kwonlyargs + scope.args.posonlyargs:
            out.setdefault(a.arg, []).append(("param", a.annotation))
    for n in _own_nodes(scope):
        if isinstance(n, ast.Assign):
            for t in n.targets:
                for x in ast.walk(t):
                    if isinstance(x, ast.Name):
                        out.setdefault(x.id, []).append(n.value if isinstance(t, ast.Name) else None)
        elif isinstance(n, (ast.AnnAssign, ast.AugAssign, ast.NamedExpr)) and isinstance(n.target, ast.Name):
            out.setdefault(n.target.id, []).append(getattr(n, "value", None))
        elif isinstance(n, ast.withitem) and isinstance(n.optional_vars, ast.Name):
            out.setdefault(n.optional_vars.id, []).append(n.context_expr)
        elif isinstance(n, (ast.For, ast.AsyncFor, ast.comprehension)):
            for x in ast.walk(n.target):
                if isinstance(x, ast.Name):
                    out.setdefault(x.id, []).append(None)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.setdefault(n.name, []).append(None)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            for a in n.names:
                out.setdefault((a.asname or a.name).split(".")[0], []).append(None)
    return out


class _Module:
    def __init__(self, tree):
        self.factories = set()
        for fn in tree.body:
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                returns = [r.value for r in ast.walk(fn) if isinstance(r, ast.Return) and r.value is not None]
                if "L3Store" in ast.unparse(fn.returns or ast.Constant("")) or any(
                        _call_name(v) == "L3Store.open" for v in returns):
                    self.factories.add(fn.name)

    def kind_of(self, value) -> "str | None":
        """'store', 'shared' or None for a value bound to a name."""
        if isinstance(value, tuple):  # a parameter
            return "store" if value[1] is not None and "L3Store" in ast.unparse(value[1]) else None
        if isinstance(value, ast.Attribute):
            return {"store": "store", "shared": "shared"}.get(value.attr)
        name = _call_name(value) if isinstance(value, ast.Call) else ""
        if name == "L3Store.open" or name in self.factories:
            return "store"
        if name.endswith(".find_open"):
            return "shared"
        return None


def _reads(path: pathlib.Path):
    """(what, attribute, line) for every attribute read on a store ('store') or a shared store ('shared')."""
    tree = ast.parse(path.read_text())
    mod = _Module(tree)

    def kinds_in(scope, outer: dict) -> dict:
        known = {"store": "store", **outer}
        for name, values in _bindings(scope).items():
            kinds = {"store" if name == "store" and isinstance(v, tuple) else mod.kind_of(v) for v in values
                     if not (isinstance(v, ast.Constant) and v.value is None)}  # `s = None` before an open
            known[name] = kinds.pop() if len(kinds) == 1 else None
        return known

    def expr_kind(node, known) -> "str | None":
        if isinstance(node, ast.Name):
            return known.get(node.id)
        if isinstance(node, ast.Attribute) and node.attr in ("store", "shared"):
            return node.attr
        return None

    def visit(scope, outer):
        known = kinds_in(scope, outer)
        for n in _own_nodes(scope):
            if isinstance(n, ast.Attribute):
                k = expr_kind(n.value, known)
                if k:
                    yield k, n.attr, n.lineno
            elif isinstance(n, ast.Call) and _call_name(n) == "getattr" and len(n.args) >= 2 \
                    and isinstance(n.args[1], ast.Constant) and isinstance(n.args[1].value, str):
                k = expr_kind(n.args[0], known)
                if k:
                    yield k, n.args[1].value, n.lineno
            if isinstance(n, _SCOPES):
                yield from visit(n, known)

    yield from visit(tree, {})


def _files():
    for top in SCANNED:
        for p in sorted((REPO / top).rglob("*.py")):
            rel = p.relative_to(REPO).as_posix()
            if "__pycache__" in p.parts or rel.startswith(OWNERS):
                continue
            yield rel, p


def test_every_name_on_the_surface_is_on_the_handle_itself():
    missing = sorted(n for n in SURFACE if not hasattr(L3Store, n))
    assert missing == []
    assert not hasattr(L3Store, "__getattr__")  # nothing is forwarded: the handle's face is what it defines


def test_tools_tests_and_benches_read_only_the_surface_of_a_store():
    off = []
    for rel, p in _files():
        pending = PENDING.get(rel, frozenset())
        for what, attr, line in _reads(p):
            allowed = (SURFACE | pending) if what == "store" else SHARED_SURFACE
            # Spying on a method of the shared store (monkeypatch.setattr(store.shared, name, ...)) is no read.
            if attr not in allowed and not (what == "shared" and attr in SURFACE):
                off.append(f"{rel}:{line}: {what}.{attr}")
    assert off == [], "read on a store outside its surface (add to diagnostics() instead):\n" + "\n".join(off)


def test_pending_private_reads_are_still_there():
    # PENDING may only shrink: an entry whose file no longer reads the name must go (and its handle property).
    for rel, names in PENDING.items():
        read = {attr for what, attr, _ in _reads(REPO / rel) if what == "store"}
        assert names <= read, f"{rel} no longer reads {sorted(names - read)}: drop it from store.PENDING"


@pytest.mark.parametrize("code,want", [
    ("def t(store):\n    store.index\n", {("store", "index")}),
    ("def t(tmp):\n    s = L3Store.open(c)\n    s._kinds\n", {("store", "_kinds")}),
    ("def t(be):\n    be.store._reloader.vectored\n", {("store", "_reloader")}),
    ("def t(be):\n    be.store.shared._kinds\n", {("store", "shared"), ("shared", "_kinds")}),
    ("def o(p):\n    return L3Store.open(p)\ndef t():\n    with o(1) as s:\n        getattr(s, '_x', 0)\n",
     {("store", "_x")}),
    ("def t():\n    s = L3Store.open(c)\n    for s in slabs:\n        s.sync()\n", set()),  # rebound: not followed
])
def test_the_scan_finds_reads_on_each_kind_of_store_binding(tmp_path, code, want):
    p = tmp_path / "m.py"
    p.write_text(code)
    assert {(w, a) for w, a, _ in _reads(p)} == want


def test_the_store_module_keeps_no_unused_aliases():
    # The single-file store's aliases are gone; slab_path stays (tests name a kind's slab file through it).
    assert not hasattr(store_mod, "ReadOnlySlab") and not hasattr(store_mod, "read_slab_meta")
