"""Render docs_internal/patch_manifest.md from the ledger's patch declarations (never edited by hand)."""

from __future__ import annotations

from typing import Sequence

from ..declare import Patch

HEADER = """# Patch manifest

Generated from the features' `patches.py`, in ledger order (`sglang_glm_ext/plugin/registry.py`), by
`sglang-glm-ext manifest --write docs_internal/patch_manifest.md`.
Do not edit by hand: `tests/patching/test_manifest.py` fails when this file is stale.
Each target's signature and source digest are checked against the installed SGLang by
`tests/patching/test_contract.py`.

Tiers: **guard** patches go in on any SGLang version (they only make plugin flags parse and fail clearly);
**feature** patches go in only on a release in their own SGLang column (elsewhere the ledger skips them and
`doctor` says why), or on any release with `SGLANG_GLM_EXT_FORCE_UNSUPPORTED=1`;
**demo** patches are CPU stand-ins for SGLang's GPU copy ops and pinned host pools, for `sglang-glm-ext demo` and
the CPU tests only: `register()` never applies them, and their installer refuses where a GPU is visible or an SGLang
server was launched in the process (a `bind` hook fills module globals SGLang leaves unbound on a CPU).

"""


def render(patches: Sequence[Patch]) -> str:
    out = [HEADER, "| id | target | hook | feature / tier | SGLang | seed lines |", "|---|---|---|---|---|---|"]
    for p in patches:
        out.append(f"| `{p.id}` | `{p.target}` | {p.hook_type} `{p.hook}` | {p.feature.name} / {p.tier.value} | "
                   f"{', '.join(p.sglang_versions)} | {p.seed_lines} |")
    out.append("")
    for p in patches:
        out += [
            f"## `{p.id}`", "",
            f"- **target**: `{p.target}` ({p.hook_type} hook `{p.hook}`)",
            f"- **reason**: {p.reason}",
            f"- **seed lines**: {p.seed_lines}",
            f"- **applies to SGLang**: {', '.join(p.sglang_versions)}",
            f"- **remove when**: {p.remove_when}",
            f"- **expected parameters**: `({', '.join(p.signature)})`; source digest `{p.source_sha or '-'}`",
            *([f"- **runs after**: {', '.join(f'`{d}`' for d in p.after)} (applied first; the ledger checks it)"]
              if p.after else []),
            "",
        ]
    return "\n".join(out)
