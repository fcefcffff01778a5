"""No file of the package holds more than a tenth of its lines (issue 9: store.py had grown to 1,351 of 6,438).

A file past that holds more than one concept; split it by who owns what (docs_internal/l3_design.md shows how the
L3 store was). Lines are counted as ``wc -l`` does.
"""

import pathlib

PKG = pathlib.Path(__file__).resolve().parents[1] / "sglang_glm_ext"


def test_no_file_holds_more_than_a_tenth_of_the_package_lines():
    lines = {p.relative_to(PKG.parent).as_posix(): p.read_bytes().count(b"\n")
             for p in PKG.rglob("*.py") if "__pycache__" not in p.parts}
    total = sum(lines.values())
    assert total > 0
    too_big = {name: n for name, n in sorted(lines.items()) if n > total / 10}
    assert not too_big, f"over {total / 10:.0f} lines (10% of {total}): {too_big}"
