"""Caps that bite: no file of the package over 600 lines, no function over 80, but the few on ``ALLOWED``.

A file past 600 lines holds more than one concern, a function past 80 more than one step: split it by who owns what
(docs_internal/l3_design.md shows how the L3 store was). ``ALLOWED`` may only shrink: each entry records the size it
had when it was listed and why it is still there; an entry that grows fails, an entry that fell under its cap fails
until it is removed, and a new offender is never added silently (it fails as not listed). Lines are counted as
``wc -l`` does for a file, from ``def`` to the last line of the body for a function (docstring included).
"""

import ast
import pathlib

PKG = pathlib.Path(__file__).resolve().parents[1] / "sglang_glm_ext"
FILE_CAP, FUNCTION_CAP = 600, 80

# "path" (a file) or "path:Qual.name" (a function) -> (its size when listed, why it has not been split yet)
ALLOWED: dict[str, tuple[int, str]] = {
}


def _sizes() -> dict[str, int]:
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        if "__pycache__" in p.parts:
            continue
        rel = p.relative_to(PKG.parent).as_posix()
        src = p.read_bytes()
        out[rel] = src.count(b"\n")
        tree = ast.parse(src)
        stack = [(tree, "")]
        while stack:
            node, prefix = stack.pop()
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    name = f"{prefix}{child.name}"
                    if not isinstance(child, ast.ClassDef):
                        out[f"{rel}:{name}"] = child.end_lineno - child.lineno + 1
                    stack.append((child, name + "."))
    return out


def _cap(key: str) -> int:
    return FUNCTION_CAP if ":" in key else FILE_CAP


def test_nothing_over_its_cap_but_what_is_allowed():
    over = {k: n for k, n in _sizes().items() if n > _cap(k) and k not in ALLOWED}
    assert not over, f"over {FILE_CAP} lines a file / {FUNCTION_CAP} a function, not on ALLOWED: {over}"


def test_the_allow_list_only_shrinks():
    sizes = _sizes()
    gone = [k for k in ALLOWED if k not in sizes]
    grew = {k: (sizes[k], n) for k, (n, _) in ALLOWED.items() if k in sizes and sizes[k] > n}
    fixed = [k for k in ALLOWED if k in sizes and sizes[k] <= _cap(k)]
    assert not gone, f"ALLOWED names what no longer exists (remove it): {gone}"
    assert not grew, f"ALLOWED entries grew (now, listed): {grew}"
    assert not fixed, f"under the cap now: remove from ALLOWED: {fixed}"
    assert all(why.strip() for _, why in ALLOWED.values()), "each ALLOWED entry says why it is still there"


def test_the_caps_find_a_long_function_and_a_long_file(tmp_path, monkeypatch):
    """The measure itself: a 90-line function and a 700-line file are seen as such (a broken walk would pass all)."""
    pkg = tmp_path / "sglang_glm_ext"
    pkg.mkdir()
    body = "".join(f"    x{i} = {i}\n" for i in range(89))
    (pkg / "long.py").write_text("class K:\n    def f(self):\n" + body.replace("    ", "        ") + "\n" * 620)
    monkeypatch.setitem(globals(), "PKG", pkg)
    sizes = _sizes()
    assert sizes["sglang_glm_ext/long.py:K.f"] == 90 and sizes["sglang_glm_ext/long.py"] == 711
