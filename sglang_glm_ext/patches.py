"""Every change sglang-glm-ext makes to SGLang, declared in one place.

docs_internal/patch_manifest.md is generated from this list (`sglang-glm-ext manifest --write`, checked by
tests/patching/test_manifest.py), and tests/test_contracts.py checks every target's signature and source
digest in the installed SGLang, so an SGLang upgrade fails fast and names what moved.
"""

from __future__ import annotations

from .patching.ledger import Patch, Tier

V0523 = ("0.5.23",)

PATCHES: tuple[Patch, ...] = (
    Patch(
        id="flags.cli_group",
        target="sglang.srt.server_args.ServerArgs.add_cli_args",
        hook_type="after",
        hook="sglang_glm_ext.flags:hook_add_cli_args",
        feature="flags",
        tier=Tier.GUARD,
        reason="Register the plugin's flags on SGLang's parser so launch_server/serve/--config accept them and "
        "--help lists them (ServerArgs is a sealed msgspec struct; no field can be added).",
        seed_lines="458-486 (--enable-cp-l3, --cp-l3-config), 152-162 (CG buffer logging switch)",
        sglang_versions=V0523,
        remove_when="SGLang offers a public API for plugin CLI arguments.",
        signature=("parser",),
        source_sha="52bd3ae9b30f6ee6",
    ),
    Patch(
        id="flags.from_cli",
        target="sglang.srt.server_args.ServerArgs.from_cli_args",
        hook_type="after",
        hook="sglang_glm_ext.flags:hook_from_cli_args",
        feature="flags",
        tier=Tier.GUARD,
        reason="Move the plugin flag values onto the ServerArgs record (bookkeeping attribute `_glm_ext`, "
        "pickled to scheduler subprocesses) and validate them before serving starts.",
        seed_lines="458-486",
        sglang_versions=V0523,
        remove_when="SGLang offers a public API for plugin CLI arguments.",
        signature=("cls", "args"),
        source_sha="e1e7c0c2d2a7f7ef",
    ),
    Patch(
        id="flags.engine_kwargs",
        target="sglang.srt.entrypoints.engine.Engine.__init__",
        hook_type="around",
        hook="sglang_glm_ext.flags:hook_engine_init",
        feature="flags",
        tier=Tier.GUARD,
        reason="Accept the plugin's options as Engine(...) keywords: take them out before msgspec rejects "
        "them, validate, and attach them to the ServerArgs the Engine builds.",
        seed_lines="458-486",
        sglang_versions=V0523,
        remove_when="SGLang offers a public API for plugin options on Engine.",
        signature=("self", "kwargs"),
        source_sha="",
    ),
    # --- cg_mem patches (seed 152-162; owner: sglang_glm_ext/cgmem) ---
    # --- end cg_mem ---
    # --- host_register / regression-fix patches (seed 297-321 and any fix 0.5.23 lacks) ---
    # --- end host_register ---
)
