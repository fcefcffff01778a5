"""Declared patches, applied and verified by the plugin itself.

Why not just HookRegistry.register(): SGLang applies registered hooks only after every plugin's register()
returned, and only *logs* a target it cannot patch. A fork replacement must know, in register(), that each of
its hooks landed. So the ledger uses SGLang's own wrapping (`HookRegistry._apply_target`, which keeps
classmethod/staticmethod descriptors and re-binds stale `from X import Y` copies) on our hooks alone, then
resolves the target again and checks that our hook is in the live wrapper chain. Other plugins' hooks on the
same target still go through SGLang's apply_hooks() afterwards and wrap ours.

Hooks are installed unconditionally (command-line flags are parsed after plugins load); each hook decides at
call time whether its feature is active.
"""

from __future__ import annotations

import enum
import hashlib
import importlib
import inspect
import logging
import pkgutil
from dataclasses import dataclass, field
from typing import Callable

logger = logging.getLogger("sglang_glm_ext")


class Tier(str, enum.Enum):
    # Guard patches make plugin flags parse and fail with a clear message; they go in on any SGLang version.
    GUARD = "guard"
    # Feature patches change serving behaviour; only on a supported SGLang (or when forced).
    FEATURE = "feature"
    # --- l3 backend ---
    # Demo/test-only stand-ins (CPU copies of GPU ops): register() never applies them; only an explicit,
    # guarded install (sglang_glm_ext/l3/hicache/testing/cpu_standins.py) does, never in a server or next to a GPU.
    DEMO = "demo"


@dataclass(frozen=True)
class Patch:
    """One change to SGLang. Every field ends up in docs_internal/patch_manifest.md."""

    id: str
    target: str  # dotted path of the patched attribute in SGLang
    hook_type: str  # before | after | around | replace (SGLang HookType values)
    hook: str  # "module:function" of our hook
    feature: str
    tier: Tier
    reason: str
    seed_lines: str  # lines of ../shared/seed/000_*.txt this carries ("-" for plugin infrastructure)
    sglang_versions: tuple[str, ...]  # releases the patch applies to
    remove_when: str
    # Parameter names the hook relies on, checked by tests/test_contracts.py against the installed SGLang.
    signature: tuple[str, ...]
    # sha256[:16] of the target's source at the time the hook was written (drift check, vllm-sail style).
    source_sha: str = ""

    def resolve_hook(self) -> Callable:
        module, _, name = self.hook.partition(":")
        return getattr(importlib.import_module(module), name)


class State(str, enum.Enum):
    APPLIED = "applied"
    SKIPPED = "skipped"
    FAILED = "failed"
    PENDING = "pending"


@dataclass
class PatchStatus:
    patch: Patch
    state: State = State.PENDING
    detail: str = ""


@dataclass
class Ledger:
    patches: tuple[Patch, ...]
    status: dict[str, PatchStatus] = field(default_factory=dict)

    def failed(self) -> list[PatchStatus]:
        return [s for s in self.status.values() if s.state is State.FAILED]


def split_target(target: str) -> tuple[str, str]:
    owner, _, attr = target.rpartition(".")
    if not owner:
        raise ValueError(f"patch target needs module.attr: {target!r}")
    return owner, attr


def resolve_original(target: str) -> Callable:
    """The function a target names, unwrapped from classmethod/staticmethod and from any hook wrappers."""
    fn = resolve_raw(target)
    while hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    return fn


def resolve_raw(target: str) -> Callable:
    owner_path, attr = split_target(target)
    owner = pkgutil.resolve_name(owner_path)
    raw = owner.__dict__.get(attr) if isinstance(owner, type) else None
    if raw is None:
        raw = getattr(owner, attr)
    if isinstance(raw, (classmethod, staticmethod)):
        raw = raw.__func__
    return raw


def source_sha(fn: Callable) -> str:
    try:
        src = inspect.getsource(fn)
    except (OSError, TypeError):
        return ""
    return hashlib.sha256(src.encode()).hexdigest()[:16]


def hook_in_chain(target: str, hook: Callable) -> bool:
    """True when `hook` is captured by a wrapper in the live chain of `target`."""
    fn = resolve_raw(target)
    seen = 0
    while fn is not None and seen < 64:
        for cell in getattr(fn, "__closure__", None) or ():
            try:
                if cell.cell_contents is hook:
                    return True
            except ValueError:  # empty cell
                continue
        fn = getattr(fn, "__wrapped__", None)
        seen += 1
    return False


def apply_one(patch: Patch, source) -> PatchStatus:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    status = PatchStatus(patch)
    try:
        hook = patch.resolve_hook()
    except Exception as exc:  # our own bug: say so loudly
        status.state, status.detail = State.FAILED, f"hook {patch.hook} not importable: {exc!r}"
        return status
    try:
        if hook_in_chain(patch.target, hook):
            status.state, status.detail = State.APPLIED, "already applied"
            return status
        HookRegistry._apply_target(patch.target, [(HookType(patch.hook_type), hook, source)])
    except Exception as exc:
        status.state, status.detail = State.FAILED, f"{type(exc).__name__}: {exc}"
        return status
    if hook_in_chain(patch.target, hook):
        status.state = State.APPLIED
    else:
        status.state, status.detail = State.FAILED, "target resolved but the hook is not in its live wrapper chain"
    return status


def apply_all(ledger: Ledger, *, allow_features: bool, why_skipped: str) -> Ledger:
    from sglang.srt.plugins.hook_registry import HookSource

    source = HookSource(plugin_name="glm_ext", dist_name="sglang-glm-ext")
    for patch in ledger.patches:
        if patch.tier is Tier.DEMO:  # --- l3 backend: demo/test-only, see Tier.DEMO ---
            ledger.status[patch.id] = PatchStatus(patch, State.SKIPPED, "demo/test-only: never applied by register()")
            continue
        if patch.tier is Tier.FEATURE and not allow_features:
            ledger.status[patch.id] = PatchStatus(patch, State.SKIPPED, why_skipped)
            continue
        st = apply_one(patch, source)
        ledger.status[patch.id] = st
        if st.state is State.FAILED:
            # Fail loud: SGLang would only log this at debug level inside apply_hooks().
            logger.error("sglang-glm-ext: patch %s on %s FAILED: %s", patch.id, patch.target, st.detail)
    return ledger
