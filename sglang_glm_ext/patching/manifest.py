"""Render docs_internal/patch_manifest.md from sglang_glm_ext.patches.PATCHES (never edited by hand)."""

from __future__ import annotations

HEADER = """# Patch manifest

Generated from `sglang_glm_ext/patches.py` by `sglang-glm-ext manifest --write docs_internal/patch_manifest.md`.
Do not edit by hand: `tests/patching/test_manifest.py` fails when this file is stale.
Each target's signature and source digest are checked against the installed SGLang by `tests/test_contracts.py`.

Tiers: **guard** patches go in on any SGLang version (they only make plugin flags parse and fail clearly);
**feature** patches go in only on a supported SGLang, or with `SGLANG_GLM_EXT_FORCE_UNSUPPORTED=1`;
**demo** patches are CPU stand-ins for SGLang's GPU copy ops and pinned host pools, for `sglang-glm-ext demo` and
the CPU tests only: `register()` never applies them, and their installer refuses where a GPU is visible or an SGLang
server was launched in the process (a `bind` hook fills module globals SGLang leaves unbound on a CPU).

"""


def render() -> str:
    from ..patches import PATCHES

    out = [HEADER, "| id | target | hook | feature / tier | SGLang | seed lines |", "|---|---|---|---|---|---|"]
    for p in PATCHES:
        out.append(f"| `{p.id}` | `{p.target}` | {p.hook_type} `{p.hook}` | {p.feature} / {p.tier.value} | "
                   f"{', '.join(p.sglang_versions)} | {p.seed_lines} |")
    out.append("")
    for p in PATCHES:
        out += [
            f"## `{p.id}`", "",
            f"- **target**: `{p.target}` ({p.hook_type} hook `{p.hook}`)",
            f"- **reason**: {p.reason}",
            f"- **seed lines**: {p.seed_lines}",
            f"- **applies to SGLang**: {', '.join(p.sglang_versions)}",
            f"- **remove when**: {p.remove_when}",
            f"- **expected parameters**: `({', '.join(p.signature)})`; source digest `{p.source_sha or '-'}`",
            "",
        ]
    return "\n".join(out)
