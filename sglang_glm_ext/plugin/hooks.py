"""The flag hooks SGLang calls through the guard patches (declared in plugin/patches.py).

They go in on any SGLang version: on an unsupported one they turn a plugin flag into one clear error instead of
"unrecognized arguments".
"""

from __future__ import annotations

from typing import Callable

from .compat import refuse_unsupported
from .features import require_switched_on_available
from .flags import (
    PluginFlagError, add_arguments, asked_in_values, attach, pop_engine_kwargs, validate, values_from_namespace,
)


def hook_add_cli_args(result, parser, *args, **kwargs):
    add_arguments(parser)
    return result


def hook_from_cli_args(server_args, cls, ns, *args, **kwargs):
    given = values_from_namespace(ns)
    refuse_unsupported(asked_in_values(given))
    try:
        values = validate(given)
        require_switched_on_available(values, server_args)
        attach(server_args, values)
    except PluginFlagError as exc:
        raise SystemExit(f"sglang-glm-ext: {exc}") from None
    return server_args


def hook_engine_init(original: Callable, self, *args, **kwargs):
    ours = pop_engine_kwargs(kwargs)
    refuse_unsupported(asked_in_values(ours))
    values = validate(ours)  # Engine users get a ValueError subclass, not SystemExit
    require_switched_on_available(values)
    if "server_args" in kwargs:
        require_switched_on_available(values, kwargs["server_args"])  # and SGLang's own switches (active_when)
        attach(kwargs["server_args"], values)
        return original(self, *args, **kwargs)
    cls = self.server_args_class

    def build(**kw):
        sa = cls(**kw)
        require_switched_on_available(values, sa)
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

