"""The one version guard: which SGLang versions the plugin supports, what is installed, and the one refusal.

SGLang only logs a plugin that fails, so the plugin guards itself. SUPPORTED_SGLANG is the range the plugin as
a whole supports; each patch also names its own `sglang_versions`, which the ledger enforces
(patching/ledger.py skip_reason). Outside the range no feature patch goes in, and a user who asked for a
plugin feature gets one clear error from `refuse_unsupported` (register()'s launch check and the flag hooks
both call it); guard patches still go in so a plugin flag fails with that error, not "unrecognized arguments".
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from typing import Sequence

from . import envs

# Exact releases the patches were written and contract-tested against. Widen only after the contract tests
# (tests/patching/test_contract.py) pass on the new release and the patch manifest has been regenerated.
SUPPORTED_SGLANG: tuple[str, ...] = ("0.5.23",)


class UnsupportedSGLangError(SystemExit):
    """Raised when a user asks for a plugin feature on an SGLang the plugin does not support.

    A SystemExit on purpose: SGLang's load_plugins() catches Exception and only logs it, and a user who passed
    `--enable-cp-l3` must get this message before serving starts, not a server without the feature.
    """


def installed_version(dist: str) -> str | None:
    """The installed version of distribution `dist`, or None when it is not installed."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def installed_sglang_version() -> str | None:
    return installed_version("sglang")


@dataclass(frozen=True)
class VersionStatus:
    installed: str | None
    supported: bool
    forced: bool

    @property
    def patches_allowed(self) -> bool:
        return self.supported or (self.forced and self.installed is not None)

    def describe(self) -> str:
        if self.installed is None:
            return "sglang is not installed"
        head = f"sglang {self.installed} ({'supported' if self.supported else 'NOT supported'}"
        tail = "; patches forced by SGLANG_GLM_EXT_FORCE_UNSUPPORTED=1)" if self.forced and not self.supported else ")"
        return head + tail

    def unsupported_message(self, what: str) -> str:
        return (
            f"sglang-glm-ext: {what} needs a supported SGLang, but the installed version is "
            f"{self.installed or 'absent'}; supported: {', '.join(SUPPORTED_SGLANG)}. Install "
            f"sglang=={SUPPORTED_SGLANG[-1]}, or upgrade sglang-glm-ext, or set "
            f"{envs.FORCE_UNSUPPORTED.name}=1 to apply the patches at your own risk."
        )


def version_status(installed: str | None = None) -> VersionStatus:
    if installed is None:
        installed = installed_sglang_version()
    return VersionStatus(
        installed=installed,
        supported=installed in SUPPORTED_SGLANG,
        forced=envs.FORCE_UNSUPPORTED.get_bool(),
    )


def refuse_unsupported(asked: Sequence[str], status: VersionStatus | None = None) -> None:
    """The one decision "asked for a plugin feature on an unsupported SGLang": one clear error, now.

    `asked` names what the user asked for (flags by their CLI names, env vars by name); nothing asked, or a
    supported (or forced) SGLang, passes. Raised as SystemExit (UnsupportedSGLangError) because SGLang's
    load_plugins() swallows Exception.
    """
    if not asked:
        return
    status = status or version_status()
    if not status.patches_allowed:
        raise UnsupportedSGLangError(status.unsupported_message(", ".join(asked)))
