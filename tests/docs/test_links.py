"""Every relative link in README.md, CHANGELOG.md and docs/ reaches a file that exists (and, for a `#section` of a
Markdown page, a heading there), the operator index links each page other helpers' tools generate, and no page in
docs/ is unreachable from the index."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# Written from the code by their own commands and tests; the index and the README must link each of them.
GENERATED_ELSEWHERE = ("metrics.md", "prometheus/alerts.yml", "grafana/sglang_glm_ext.json", "cli.md")
QUICKSTARTS = ("l3", "l3_cp", "hugepages", "megamoe", "cuda_graph_mem", "cpu_serve", "gpu_bringup", "host_dedup")

_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
_INLINE = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)


def pages() -> list[pathlib.Path]:
    return [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted(DOCS.rglob("*.md"))]


def _prose(text: str) -> str:
    """The text without fenced blocks and code spans: `[[0, 1]](x)` inside code is not a link."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def links(text: str) -> list[str]:
    prose = _prose(text)
    return _INLINE.findall(prose) + _REFERENCE.findall(prose)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, code marks and punctuation dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: pathlib.Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in _HEADING.findall(_FENCE.sub("", page.read_text())):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken(page: pathlib.Path) -> list[str]:
    """Each relative link of ``page`` that reaches no file (or no heading of a Markdown page), with why."""
    out = []
    for target in links(page.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.is_file():
            out.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            out.append(f"{target}: no such heading there")
    return out


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_reaches_a_file(page):
    assert page.is_file()
    assert broken(page) == [], f"{page.relative_to(ROOT)}: dead links"


def test_the_checker_finds_a_dead_link_and_a_missing_heading_and_skips_code(tmp_path):
    (tmp_path / "there.md").write_text("# A `code` heading: here\n\n## Twice\n\n## Twice\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](there.md#a-code-heading-here) [ok2](there.md#twice-1) [web](https://example.org/x)\n"
                    "[gone](missing.md) [no section](there.md#nowhere) `[[0, 1]](not-a-link)`\n"
                    "```\n[in a block](also-not-a-link.md)\n```\n[ref]: gone-too.md\n")
    assert broken(page) == ["missing.md: no such file", "there.md#nowhere: no such heading there",
                            "gone-too.md: no such file"]


def test_the_index_and_the_readme_link_every_operator_page():
    index = {t.partition("#")[0] for t in links((DOCS / "README.md").read_text())}
    readme = {t.partition("#")[0] for t in links((ROOT / "README.md").read_text())}
    wanted = {*GENERATED_ELSEWHERE, "install.md", "upgrade.md", "troubleshooting.md", "l3_config_reference.md",
              *(f"quickstart/{q}.md" for q in QUICKSTARTS)}
    assert wanted <= index, sorted(wanted - index)
    assert {f"docs/{w}" for w in wanted} | {"docs/README.md", "CHANGELOG.md"} <= readme, \
        sorted({f"docs/{w}" for w in wanted} - readme)
    for name in GENERATED_ELSEWHERE:
        assert (DOCS / name).is_file(), f"docs/{name} is linked but missing"


def test_every_docs_page_is_reachable_from_the_index():
    reached, todo = set(), [DOCS / "README.md"]
    while todo:
        page = todo.pop()
        if page in reached or not page.is_file():
            continue
        reached.add(page)
        for target in links(page.read_text()):
            path = target.partition("#")[0]
            if path.endswith(".md") and not re.match(r"^[a-z][a-z0-9+.-]*:", path, re.I):
                todo.append((page.parent / path).resolve())
    orphans = [str(p.relative_to(ROOT)) for p in DOCS.rglob("*.md") if p.resolve() not in reached]
    assert orphans == []


def test_the_readme_sends_operators_to_the_docs_before_the_developer_set_up():
    readme = (ROOT / "README.md").read_text()
    operators, set_up = readme.find("\n## For operators\n"), readme.find("\n## Set-up on a fresh clone")
    assert 0 < operators < set_up
    assert "](docs/README.md)" in readme[operators:set_up]
