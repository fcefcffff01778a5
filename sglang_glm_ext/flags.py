"""The plugin's command-line flags, carried the SGLang way.

0.5.23's ServerArgs is a sealed msgspec struct built at import time: no field can be added. Its `dict=True`
bookkeeping is the seam: `ServerArgs.__setattr__` accepts non-field underscore names, and `__reduce__` pickles
`__dict__` along with the fields, so `server_args._glm_ext` reaches every scheduler subprocess.

Routes in:
- `python -m sglang.launch_server` / `sglang serve`: an AFTER hook on `ServerArgs.add_cli_args` adds an
  argument group (so `launch_server --help` lists it and `--config` YAML accepts the keys, since SGLang's
  ConfigArgumentMerger reads the parser), and an AFTER hook on `ServerArgs.from_cli_args` moves the values
  onto the record and validates them.
- `Engine(enable_cp_l3=True, ...)`: an AROUND hook on `Engine.__init__` takes the plugin's keywords out before
  msgspec sees them.
`sglang serve --help` prints before plugins load, so it cannot list these flags: use
`python -m sglang.launch_server --help` or `sglang-glm-ext flags`.
"""

from __future__ import annotations

import argparse
import logging
import os
from dataclasses import dataclass
from typing import Any, Callable

from . import envs

logger = logging.getLogger("sglang_glm_ext")

ATTR = "_glm_ext"


class PluginFlagError(ValueError):
    """A plugin flag has a bad value; raised before serving starts."""


@dataclass(frozen=True)
class Flag:
    name: str  # attribute / Engine keyword
    feature: str
    help: str
    kind: str = "bool"  # bool | path | int
    default: Any = None
    env: envs.EnvVar | None = None

    @property
    def cli(self) -> str:
        return "--" + self.name.replace("_", "-")


FLAGS: tuple[Flag, ...] = (
    Flag("enable_cp_l3", "l3", "Enable the durable L3 disk tier for HiCache (needs --cp-l3-config).", "bool", False),
    Flag("cp_l3_config", "l3", "Path to the L3 config (TOML or JSON); `sglang-glm-ext l3 example-config` writes one.",
         "path", None),
    Flag("log_cuda_graph_buffers", "cg_mem",
         "At decode CUDA-graph capture, log static buffers, aliasing and graph-pool growth per shape (rank 0).",
         "bool", False, envs.LOG_CG_BUFFERS),
)
FLAG_BY_NAME = {f.name: f for f in FLAGS}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("sglang-glm-ext", "Flags added by the sglang-glm-ext plugin.")
    existing = {s for a in parser._actions for s in a.option_strings}
    for flag in FLAGS:
        if flag.cli in existing:  # idempotent: never register a flag twice on one parser
            continue
        if flag.kind == "bool":
            group.add_argument(flag.cli, dest=f"glm_ext__{flag.name}", action="store_true", help=flag.help)
        else:
            group.add_argument(flag.cli, dest=f"glm_ext__{flag.name}", type=str if flag.kind == "path" else int,
                               default=flag.default, help=flag.help)


def values_from_namespace(ns: argparse.Namespace) -> dict[str, Any]:
    return {f.name: getattr(ns, f"glm_ext__{f.name}") for f in FLAGS if hasattr(ns, f"glm_ext__{f.name}")}


def pop_engine_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {name: kwargs.pop(name) for name in list(kwargs) if name in FLAG_BY_NAME}


def validate(values: dict[str, Any]) -> dict[str, Any]:
    """Normalize and check flag values. Every problem is a PluginFlagError naming the flag."""
    out = {f.name: f.default for f in FLAGS}
    for name, value in values.items():
        flag = FLAG_BY_NAME.get(name)
        if flag is None:
            raise PluginFlagError(f"unknown sglang-glm-ext option {name!r}; known: {sorted(FLAG_BY_NAME)}")
        if flag.kind == "bool" and not isinstance(value, bool):
            raise PluginFlagError(f"{flag.cli} expects true/false, got {value!r}")
        out[name] = value
    if out["cp_l3_config"] is not None and not out["enable_cp_l3"]:
        raise PluginFlagError("--cp-l3-config was given without --enable-cp-l3; add --enable-cp-l3 or drop it")
    if out["enable_cp_l3"]:
        _validate_l3(out["cp_l3_config"])
    _require_active_features_available(out)
    return out


def _require_active_features_available(values: dict[str, Any]) -> None:
    """A feature switched on (by flag or env var) whose patches did not land refuses the launch, loudly."""
    from . import features

    resolved = fold_env(values)
    for feature in features.FEATURES:
        if not feature.always_on and features.active_in(feature.name, resolved):
            features.require_available(feature.name)


def fold_env(values: dict[str, Any]) -> dict[str, Any]:
    """An env var switches a boolean feature on without its flag."""
    out = dict(values)
    for flag in FLAGS:
        if flag.env is not None and flag.kind == "bool" and not out.get(flag.name) and flag.env.get_bool():
            out[flag.name] = True
    return out


def _validate_l3(path: str | None) -> None:
    if not path:
        raise PluginFlagError("--enable-cp-l3 needs --cp-l3-config PATH (write one: sglang-glm-ext l3 example-config)")
    if not os.path.isfile(path):
        raise PluginFlagError(f"--cp-l3-config {path!r}: no such file")
    try:
        from .l3.config import L3Config
    except ImportError as exc:  # pragma: no cover - packaging bug
        raise PluginFlagError(f"--enable-cp-l3: L3 engine not importable: {exc}") from exc
    try:
        L3Config.load(path)
    except Exception as exc:
        raise PluginFlagError(f"--cp-l3-config {path!r}: {exc}") from exc


def attach(server_args: Any, values: dict[str, Any]) -> None:
    setattr(server_args, ATTR, dict(values))


def get(server_args: Any = None) -> dict[str, Any]:
    """The plugin flag values in effect in this process (defaults when none were given)."""
    if server_args is None:
        try:
            from sglang.srt.runtime_context import get_server_args

            server_args = get_server_args()
        except Exception:
            server_args = None
    return fold_env(getattr(server_args, ATTR, None) or {f.name: f.default for f in FLAGS})


# ---- hooks (declared in sglang_glm_ext/patches.py) ----

def hook_add_cli_args(result, parser, *args, **kwargs):
    add_arguments(parser)
    return result


def hook_from_cli_args(server_args, cls, ns, *args, **kwargs):
    _guard_version(values_from_namespace(ns))
    try:
        attach(server_args, validate(values_from_namespace(ns)))
        # --- l3 backend: the storage-backend fields go onto the record here too, for a one-line CLI error ---
        from .l3.hicache.hooks import translate

        translate(server_args)
    except PluginFlagError as exc:
        raise SystemExit(f"sglang-glm-ext: {exc}") from None
    return server_args


def hook_engine_init(original: Callable, self, *args, **kwargs):
    ours = pop_engine_kwargs(kwargs)
    _guard_version(ours)
    values = validate(ours)  # Engine users get a ValueError subclass, not SystemExit
    if "server_args" in kwargs:
        attach(kwargs["server_args"], values)
        return original(self, *args, **kwargs)
    cls = self.server_args_class

    def build(**kw):
        sa = cls(**kw)
        attach(sa, values)
        return sa

    # An instance attribute shadows the class one for this construction only; restore whatever was there.
    had, prev = "server_args_class" in self.__dict__, self.__dict__.get("server_args_class")
    self.server_args_class = build
    try:
        return original(self, *args, **kwargs)
    finally:
        if had:
            self.__dict__["server_args_class"] = prev
        else:
            self.__dict__.pop("server_args_class", None)


def _guard_version(values: dict[str, Any]) -> None:
    from . import compat

    asked = [FLAG_BY_NAME[n].cli for n, v in values.items() if v not in (None, False)]
    status = compat.version_status()
    if asked and not status.patches_allowed:
        raise compat.UnsupportedSGLangError(status.unsupported_message(" ".join(asked)))
