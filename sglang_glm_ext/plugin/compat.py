"""Which SGLang versions the plugin supports, and what the installed one is.

SGLang only logs a plugin that fails, so the plugin guards itself: outside SUPPORTED_SGLANG it applies no
feature patch (the guard hooks that turn plugin flags into one clear error still go in).
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass

from . import envs

# Exact releases the patches were written and contract-tested against. Widen only after the contract tests
# (tests/test_contracts.py) pass on the new release and the patch manifest has been regenerated.
SUPPORTED_SGLANG: tuple[str, ...] = ("0.5.23",)


class UnsupportedSGLangError(SystemExit):
    """Raised when a user asks for a plugin feature on an SGLang the plugin does not support.

    A SystemExit on purpose: SGLang's load_plugins() catches Exception and only logs it, and a user who passed
    `--enable-cp-l3` must get this message before serving starts, not a server without the feature.
    """


def installed_sglang_version() -> str | None:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


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
