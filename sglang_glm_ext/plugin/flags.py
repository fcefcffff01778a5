"""The plugin's flags: parsed, validated and carried the SGLang way (each feature declares its own in feature.py).

0.5.23's ServerArgs is a sealed msgspec struct built at import time: no field can be added. Its `dict=True`
bookkeeping is the seam: `ServerArgs.__setattr__` accepts non-field underscore names, and `__reduce__` pickles
`__dict__` along with the fields, so `server_args._glm_ext` (declare.CARRIER_ATTR) reaches every scheduler subprocess.

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
import os
from typing import Any, Mapping, Sequence

from ..declare import CARRIER_ATTR, PluginFlagError, carried_values
from .registry import FEATURES, FEATURE_ENV_VARS, FLAG_BY_NAME, FLAGS

__all__ = [
    "FLAGS", "FLAG_BY_NAME", "PluginFlagError", "add_arguments", "asked_at_launch", "asked_in_values", "attach",
    "get", "pop_engine_kwargs", "validate", "values_from_namespace",
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("sglang-glm-ext", "Flags added by the sglang-glm-ext plugin.")
    existing = {s for a in parser._actions for s in a.option_strings}
    for flag in FLAGS:
        if flag.cli in existing:  # idempotent: never register a flag twice on one parser
            continue
        if flag.kind == "bool":
            group.add_argument(flag.cli, dest=f"glm_ext__{flag.name}", action="store_true", help=flag.help)
        else:
            # metavar: the kind, as the flag table names it (`--cp-l3-config PATH`), not the carrier's dest
            group.add_argument(flag.cli, dest=f"glm_ext__{flag.name}", type=int if flag.kind == "int" else str,
                               default=flag.default, metavar=flag.metavar, choices=flag.choices or None,
                               help=flag.help)


def values_from_namespace(ns: argparse.Namespace) -> dict[str, Any]:
    return {f.name: getattr(ns, f"glm_ext__{f.name}") for f in FLAGS if hasattr(ns, f"glm_ext__{f.name}")}


def pop_engine_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {name: kwargs.pop(name) for name in list(kwargs) if name in FLAG_BY_NAME}


def validate(values: Mapping[str, Any]) -> dict[str, Any]:
    """Normalize and check flag values: every flag present (defaults filled in), each of the right kind, and each
    feature's own check passed. Every problem is a PluginFlagError naming the flag."""
    out = {f.name: f.default for f in FLAGS}
    for name, value in values.items():
        flag = FLAG_BY_NAME.get(name)
        if flag is None:
            raise PluginFlagError(f"unknown sglang-glm-ext option {name!r}; known: {sorted(FLAG_BY_NAME)}")
        if flag.kind == "bool" and not isinstance(value, bool):
            raise PluginFlagError(f"{flag.cli} expects true/false, got {value!r}")
        if flag.choices and value is not None and str(value).strip().lower() not in flag.choices:
            raise PluginFlagError(f"{flag.cli} {value}: expected one of {', '.join(flag.choices)}")
        out[name] = value
    for feature in FEATURES:
        if feature.validate is not None:
            feature.validate(out)
    return out


def attach(server_args: Any, values: Mapping[str, Any]) -> None:
    setattr(server_args, CARRIER_ATTR, dict(values))


def get(server_args: Any = None) -> dict[str, Any]:
    """The plugin flag values in effect in this process: those carried on `server_args` (or on the record SGLang
    published), defaults for the rest, each bool flag turned on by its env var."""
    carried = carried_values(server_args)
    return {f.name: f.value_in(carried) for f in FLAGS}


def asked_in_values(values: Mapping[str, Any]) -> list[str]:
    """The flags these values ask for (given, not left at off/None), by their CLI names."""
    return [FLAG_BY_NAME[n].cli for n, v in values.items() if n in FLAG_BY_NAME and v not in (None, False)]


def asked_at_launch(argv: Sequence[str]) -> list[str]:
    """The plugin flags on a launch's command line and the feature env vars set in its environment.

    Read from argv, not the parser: on an SGLang the plugin does not know, the parser hooks may not go in.
    """
    asked = [f.cli for f in FLAGS if any(a == f.cli or a.startswith(f.cli + "=") for a in argv)]
    asked += [e.name for e in FEATURE_ENV_VARS if e.is_set() and os.environ[e.name] not in ("", "0")]
    return asked
