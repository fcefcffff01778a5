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
import inspect
import logging
import pkgutil
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ..declare import Patch, Tier

logger = logging.getLogger("sglang_glm_ext")


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
    return unwrap(resolve_raw(target))


def resolve_raw(target: str) -> Callable:
    """The live function a target names (wrappers included), classmethod/staticmethod unwrapped."""
    owner_path, attr = split_target(target)
    return raw_attr(pkgutil.resolve_name(owner_path), attr)


def raw_attr(owner, attr: str) -> Callable:
    """`owner.attr` as stored: a class's own __dict__ entry first (so descriptors are seen, not bound methods),
    with classmethod/staticmethod taken off to the function they hold."""
    raw = owner.__dict__.get(attr) if isinstance(owner, type) else None
    if raw is None:
        raw = getattr(owner, attr)
    if isinstance(raw, (classmethod, staticmethod)):
        raw = raw.__func__
    return raw


def unwrap(fn: Callable) -> Callable:
    """The function under every `__wrapped__` layer (hook wrappers, functools.wraps decorators)."""
    while hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    return fn


def source_sha(fn: Callable) -> str:
    try:
        src = inspect.getsource(fn)
    except (OSError, TypeError):
        return ""
    return hashlib.sha256(src.encode()).hexdigest()[:16]


def chain_depth(target: str, hook: Callable) -> int | None:
    """How many wrappers of the live chain of `target` lie outside the one that captures `hook` (0: the outermost);
    None when no wrapper captures it. A deeper AFTER hook runs its hook earlier on each call."""
    fn = resolve_raw(target)
    depth = 0
    while fn is not None and depth < 64:
        for cell in getattr(fn, "__closure__", None) or ():
            try:
                if cell.cell_contents is hook:
                    return depth
            except ValueError:  # empty cell
                continue
        fn = getattr(fn, "__wrapped__", None)
        depth += 1
    return None


def hook_in_chain(target: str, hook: Callable) -> bool:
    """True when `hook` is captured by a wrapper in the live chain of `target`."""
    return chain_depth(target, hook) is not None


def order_problems(patches: Sequence[Patch]) -> dict[str, str]:
    """Each patch whose declared `after` order the ledger cannot honour, with why: the patches it names must be
    AFTER patches of its own target (as it must be one), listed before it, so they are applied first and their
    hooks sit inside its wrapper."""
    index = {p.id: i for i, p in enumerate(patches)}
    out: dict[str, str] = {}
    for i, p in enumerate(patches):
        for dep in p.after:
            j = index.get(dep)
            if j is None:
                why = f"runs after {dep}, which is not in the ledger"
            elif patches[j].target != p.target:
                why = f"runs after {dep}, a patch of another target ({patches[j].target})"
            elif p.hook_type != "after" or patches[j].hook_type != "after":
                why = f"runs after {dep}: an order between AFTER hooks only ({p.hook_type}, {patches[j].hook_type})"
            elif j > i:
                why = f"runs after {dep}, which the ledger lists later: it would be applied outside this one"
            else:
                continue
            out[p.id] = why
            break
    return out


def _live_order(patch: Patch, status: dict[str, PatchStatus]) -> str:
    """'' when every hook `patch` runs after sits inside its wrapper in the live chain, else why not."""
    mine = chain_depth(patch.target, patch.resolve_hook())
    for dep in patch.after:
        st = status.get(dep)
        if st is None or st.state is not State.APPLIED:
            return f"runs after {dep}, which is {st.state.value if st else 'not applied'}"
        theirs = chain_depth(patch.target, st.patch.resolve_hook())
        if mine is None or theirs is None or theirs <= mine:
            return f"its hook would run before {dep}'s on {patch.target}: it must run after it"
    return ""


def apply_one(patch: Patch, source) -> PatchStatus:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    status = PatchStatus(patch)
    try:
        hook = patch.resolve_hook()
    except Exception as exc:  # our own bug: say so loudly
        status.state, status.detail = State.FAILED, f"hook {patch.hook} not importable: {exc!r}"
        return status
    if patch.hook_type == "bind":  # --- cpu_serve ---
        return _apply_bind(patch, hook, status)
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


# --- cpu_serve ---
def _apply_bind(patch: Patch, hook: Callable, status: PatchStatus) -> PatchStatus:
    """A "bind" patch fills module globals of `patch.target` (`patch.signature`: the names): its hook binds them
    (`hook(target, names)`), then each name must be bound in the live module."""
    import importlib

    try:
        hook(patch.target, patch.signature)
        module = importlib.import_module(patch.target)
    except Exception as exc:
        status.state, status.detail = State.FAILED, f"{type(exc).__name__}: {exc}"
        return status
    missing = [n for n in patch.signature if getattr(module, n, None) is None]
    if missing:
        status.state, status.detail = State.FAILED, f"still unbound in {patch.target}: {', '.join(missing)}"
    else:
        status.state = State.APPLIED
    return status


DEMO_SKIP_DETAIL = "demo/test-only: never applied by register()"


def skip_reason(patch: Patch, installed: str | None, *, forced: bool = False) -> str:
    """'' when `patch` goes in on SGLang `installed`, else why it is skipped.

    Guard patches go in everywhere (they only make plugin flags parse and fail clearly). A feature patch goes in
    only on a release in its own `sglang_versions`, or on any installed release when forced
    (SGLANG_GLM_EXT_FORCE_UNSUPPORTED=1).
    """
    if patch.tier is Tier.GUARD or installed in patch.sglang_versions:
        return ""
    if forced and installed is not None:
        return ""
    return (f"sglang {installed or 'absent'} is outside this patch's SGLang versions "
            f"({', '.join(patch.sglang_versions)})")


def apply_all(ledger: Ledger, *, installed: str | None, forced: bool = False, unsupported: str = "",
              cpu_serve_off: str = "Tier.CPU_SERVE is applied only by register() with the CPU serving mode on",
              gpu_bringup_off: str = "Tier.GPU_BRINGUP is applied only by register() with the GPU bring-up tier on",
              ) -> Ledger:
    """Apply every patch of `ledger` that skip_reason() lets in on `installed`; record each one's state.

    `unsupported` is set when the plugin as a whole does not support `installed` (register() passes compat's
    description): a skipped patch then gives that reason, which tells a user more than the patch's own range.
    `cpu_serve_off`: '' when the CPU serving mode may run in this process (register() asks cpu_serve's gate),
    else why its Tier.CPU_SERVE patches are skipped. `gpu_bringup_off`: the same for the GPU bring-up tier.
    A patch that declares `after` fails (and is never applied) where the ledger lists what it names after it, and
    fails where the live chain does not run those hooks first.
    """
    from sglang.srt.plugins.hook_registry import HookSource

    source = HookSource(plugin_name="glm_ext", dist_name="sglang-glm-ext")
    misordered = order_problems(ledger.patches)
    for patch in ledger.patches:
        if patch.tier is Tier.DEMO:  # demo/test-only stand-ins: their feature's guarded installer, never register()
            ledger.status[patch.id] = PatchStatus(patch, State.SKIPPED, DEMO_SKIP_DETAIL)
            continue
        if patch.tier is Tier.CPU_SERVE and cpu_serve_off:  # --- cpu_serve ---
            ledger.status[patch.id] = PatchStatus(patch, State.SKIPPED, f"CPU serving mode off: {cpu_serve_off}")
            continue
        if patch.tier is Tier.GPU_BRINGUP and gpu_bringup_off:
            ledger.status[patch.id] = PatchStatus(patch, State.SKIPPED, f"GPU bring-up tier off: {gpu_bringup_off}")
            continue
        why = skip_reason(patch, installed, forced=forced)
        if why:
            ledger.status[patch.id] = PatchStatus(patch, State.SKIPPED, unsupported or why)
            continue
        if patch.id in misordered:  # applied out of order it would run silently wrong: never apply it
            st = PatchStatus(patch, State.FAILED, misordered[patch.id])
        else:
            st = apply_one(patch, source)
        if st.state is State.APPLIED and patch.after:
            why = _live_order(patch, ledger.status)
            if why:
                st = PatchStatus(patch, State.FAILED, why)
        ledger.status[patch.id] = st
        if st.state is State.FAILED:
            # Fail loud: SGLang would only log this at debug level inside apply_hooks().
            logger.error("sglang-glm-ext: patch %s on %s FAILED: %s", patch.id, patch.target, st.detail)
    return ledger
