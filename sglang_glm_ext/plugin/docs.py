"""Generated documentation tables: the README's flag/env table comes from the registry (FLAGS, ENV_VARS)."""

from __future__ import annotations

from .registry import ENV_VARS, FLAGS, feature_of


def flags_table() -> str:
    rows = ["| switch | kind | feature | default | what it does |", "|---|---|---|---|---|"]
    for f in FLAGS:
        also = f" (also `{f.env.name}=1`)" if f.env else ""
        kind = "flag" if f.kind == "bool" else f"flag `{f.metavar}`"
        rows.append(f"| `{f.cli}` | {kind} | {_owner(f)} | `{f.default}` | {f.help}{also} |")
    for e in ENV_VARS:
        rows.append(f"| `{e.name}` | env | {_owner(e)} | `{e.default or 'unset'}` | {e.help} |")
    return "\n".join(rows) + "\n"


def _owner(item) -> str:
    feature = feature_of(item)
    return feature.name if feature is not None else "plugin"
