"""Generated documentation tables: the README's flag/env table comes from FLAGS and ENV_VARS."""

from __future__ import annotations


def flags_table() -> str:
    from ..envs import ENV_VARS
    from .flags import FLAGS

    rows = ["| switch | kind | feature | default | what it does |", "|---|---|---|---|---|"]
    for f in FLAGS:
        also = f" (also `{f.env.name}=1`)" if f.env else ""
        kind = "flag" if f.kind == "bool" else f"flag `{f.kind.upper()}`"
        rows.append(f"| `{f.cli}` | {kind} | {f.feature} | `{f.default}` | {f.help}{also} |")
    for e in ENV_VARS:
        rows.append(f"| `{e.name}` | env | {e.feature} | `{e.default or 'unset'}` | {e.help} |")
    return "\n".join(rows) + "\n"
