"""The guard patches that carry plugin flags through SGLang's parser and Engine (hooks: plugin/hooks.py).

They go in on any SGLang version: there they only make plugin flags parse and, on an unsupported release, fail
with one clear error."""

from __future__ import annotations

from ..declare import Patch, Tier, patch_for
from .feature import FEATURE

patch = patch_for(FEATURE, tier=Tier.GUARD, sglang_versions=("0.5.23",))

PATCHES: tuple[Patch, ...] = (
    patch(
        id="flags.cli_group",
        target="sglang.srt.server_args.ServerArgs.add_cli_args",
        hook_type="after",
        hook="sglang_glm_ext.plugin.hooks:hook_add_cli_args",
        reason="Register the plugin's flags on SGLang's parser so launch_server/serve/--config accept them and "
        "--help lists them (ServerArgs is a sealed msgspec struct; no field can be added).",
        seed_lines="458-486 (--enable-cp-l3, --cp-l3-config), 152-162 (CG buffer logging switch)",
        remove_when="SGLang offers a public API for plugin CLI arguments.",
        signature=("parser",),
        source_sha="8d5f9b207365f5ba",
    ),
    patch(
        id="flags.from_cli",
        target="sglang.srt.server_args.ServerArgs.from_cli_args",
        hook_type="after",
        hook="sglang_glm_ext.plugin.hooks:hook_from_cli_args",
        reason="Move the plugin flag values onto the ServerArgs record (bookkeeping attribute `_glm_ext`, "
        "pickled to scheduler subprocesses) and validate them before serving starts.",
        seed_lines="458-486",
        remove_when="SGLang offers a public API for plugin CLI arguments.",
        signature=("cls", "args"),
        source_sha="32152825e268b6da",
    ),
    patch(
        id="flags.engine_kwargs",
        target="sglang.srt.entrypoints.engine.Engine.__init__",
        hook_type="around",
        hook="sglang_glm_ext.plugin.hooks:hook_engine_init",
        reason="Accept the plugin's options as Engine(...) keywords: take them out before msgspec rejects "
        "them, validate, and attach them to the ServerArgs the Engine builds.",
        seed_lines="458-486",
        remove_when="SGLang offers a public API for plugin options on Engine.",
        signature=("self", "kwargs"),
        source_sha="54412adbf86ad86b",
    ),
)
