"""Contract check: does the installed SGLang still have each patch target as the hook expects it?

Used by tests/patching/test_contract.py (CPU, every declared patch). An SGLang upgrade that moves, renames or
re-signs a target, or changes its code, shows up here by name instead of as a silently inert hook.
"""

from __future__ import annotations

import inspect

from .ledger import Patch, resolve_original, source_sha


def check(patch: Patch) -> list[str]:
    """Problems with `patch`'s target in the installed SGLang; [] when the contract holds."""
    try:
        fn = resolve_original(patch.target)
    except Exception as exc:
        return [f"{patch.id}: target {patch.target} not found ({type(exc).__name__}: {exc})"]
    problems = []
    try:
        params = tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError) as exc:
        return [f"{patch.id}: cannot read the signature of {patch.target}: {exc}"]
    if params != patch.signature:
        problems.append(f"{patch.id}: {patch.target} has parameters {params}, the hook expects {patch.signature}")
    if patch.source_sha:
        got = source_sha(fn)
        if got != patch.source_sha:
            problems.append(
                f"{patch.id}: source of {patch.target} changed (digest {got}, declared {patch.source_sha}); "
                "review the hook against the new code, then update source_sha in its feature's patches.py"
            )
    return problems
