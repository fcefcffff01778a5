"""docs_internal/patch_manifest.md is generated from the declarations and must not go stale."""

import pathlib

from sglang_glm_ext.plugin.registry import PATCHES
from sglang_glm_ext.patching.manifest import render

MANIFEST = pathlib.Path(__file__).resolve().parents[2] / "docs_internal" / "patch_manifest.md"


def test_manifest_is_current():
    assert MANIFEST.read_text() == render(PATCHES), (
        "docs_internal/patch_manifest.md is stale: run `sglang-glm-ext manifest --write docs_internal/patch_manifest.md`"
    )


def test_every_declaration_is_complete():
    ids = [p.id for p in PATCHES]
    assert len(ids) == len(set(ids)), "duplicate patch ids"
    for p in PATCHES:
        for field in ("target", "hook", "reason", "seed_lines", "remove_when"):
            assert getattr(p, field).strip(), f"{p.id}: empty {field}"
        assert p.feature.name.strip(), f"{p.id}: empty feature"  # a Feature record now, not its name
        assert p.sglang_versions, p.id
        # "bind" (fill a module global SGLang leaves unbound on a CPU) exists only for the CPU stand-ins (demo/test
        # and the CPU serving mode's).
        assert p.hook_type in ("before", "after", "around", "replace") or (
            p.hook_type == "bind" and p.tier.value in ("demo", "cpu_serve")), p.id
        p.resolve_hook()  # the hook function exists
