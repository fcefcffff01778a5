"""A launch's whole command line, read the way SGLang reads it: `sglang-glm-ext doctor -- python -m sglang.launch_server ...`.

`split_command(words)` takes the words a user would paste: leading `NAME=VALUE` assignments (optionally after
`env`), then `python -m sglang.launch_server ARGS`, `sglang serve ARGS`, or SGLang's ARGS alone, and returns the
environment assignments, the entry point and its arguments; it imports no SGLang (the environment must be set
before SGLang and the plugin read it). `sglang_argv(cmd)` is what prepare_server_args then gets (for `sglang
serve`, after SGLang's own --model-type and positional model-path handling).

`parse(argv)` runs SGLang's own parser, `ServerArgs.add_cli_args` (to which the plugin's guard patch adds its
flags, as in a server), with `--config` YAML merged as `prepare_server_args` merges it. What SGLang would refuse
(an unknown argument, a value outside SGLang's own choices, a missing --model-path) is a LaunchLineError carrying
argparse's message. `server_args(ns)` builds the record through `ServerArgs.from_cli_args`, so the plugin's launch
checks on it (flag validation, the L3 translation) run as at a real launch; their refusals are SystemExit.
"""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

__all__ = ["Command", "LaunchLineError", "parse", "server_args", "sglang_argv", "split_command", "ENTRIES"]

ENTRIES = ("python -m sglang.launch_server", "sglang serve")
_ENV_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_PYTHON = re.compile(r"python(\d+(\.\d+)*)?")
_PY_OPTS_WITH_VALUE = {"-X", "-W", "-c"}


class LaunchLineError(ValueError):
    """The launch's command line is not one SGLang would accept (argparse's message), or not a launch at all."""


@dataclass(frozen=True)
class Command:
    """A launch as typed: environment assignments, how SGLang was started, and SGLang's own arguments."""

    env: dict[str, str] = field(default_factory=dict)
    entry: str = "arguments"  # one of ENTRIES, or "arguments" (SGLang's arguments alone)
    argv: tuple[str, ...] = ()

    def describe(self) -> str:
        env = " ".join(f"{k}={v}" for k, v in self.env.items())
        head = "" if self.entry == "arguments" else self.entry
        return " ".join(w for w in (env, head, " ".join(self.argv)) if w)


def split_command(words: Sequence[str]) -> Command:
    words = list(words)
    if words[:1] == ["--"]:
        words = words[1:]
    if words[:1] == ["env"]:
        words = words[1:]
    env: dict[str, str] = {}
    while words and _ENV_WORD.match(words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    if not words:
        raise LaunchLineError("no launch after the environment: give `python -m sglang.launch_server ARGS`, "
                              "`sglang serve ARGS` or SGLang's ARGS")
    first = words[0]
    if first.startswith("-"):
        return Command(env, "arguments", tuple(words))
    base = os.path.basename(first)
    if _PYTHON.fullmatch(base):
        i = 1
        while i < len(words) and words[i] != "-m" and words[i].startswith("-"):
            i += 2 if words[i] in _PY_OPTS_WITH_VALUE else 1
        if words[i:i + 2] == ["-m", "sglang.launch_server"]:
            return Command(env, ENTRIES[0], tuple(words[i + 2:]))
        raise LaunchLineError(f"{' '.join(words[:i + 2])!r} does not start SGLang's server: doctor checks "
                              "`python -m sglang.launch_server ARGS`")
    if base == "sglang" and words[1:2] == ["serve"]:
        return Command(env, ENTRIES[1], tuple(words[2:]))
    raise LaunchLineError(f"cannot read {first!r} as a launch: give `python -m sglang.launch_server ARGS`, "
                          "`sglang serve ARGS` or SGLang's ARGS after --")


def sglang_argv(cmd: Command) -> list[str]:
    """The argv prepare_server_args gets for this launch: for `sglang serve`, after SGLang's own --model-type and
    positional-model handling (sglang/cli/serve.py serve(), the functions it calls)."""
    if cmd.entry != ENTRIES[1]:
        return list(cmd.argv)
    from sglang.cli.serve import _extract_model_type_override, _normalize_positional_model_path

    try:
        backend, argv = _extract_model_type_override(list(cmd.argv))
    except ValueError as exc:
        raise LaunchLineError(f"sglang serve: {exc}") from None
    if backend not in ("auto", "llm"):
        raise LaunchLineError(f"sglang serve --model-type {backend}: doctor checks LLM launches only")
    return _normalize_positional_model_path(argv)[0]


class _RaisingParser(argparse.ArgumentParser):
    """SGLang's parser, but an error is a LaunchLineError (argparse's own message) instead of exit 2."""

    def error(self, message: str):  # noqa: D102 - argparse API
        raise LaunchLineError(message)


def sglang_parser(*, require_model_path: bool = True) -> argparse.ArgumentParser:
    """SGLang's argument parser, as prepare_server_args builds it (plugin flags included once the plugin has
    registered: its guard patch hooks ServerArgs.add_cli_args). No --help: a launch line is not a help request."""
    from sglang.srt.server_args import ServerArgs

    parser = _RaisingParser(prog="sglang serve", add_help=False)
    ServerArgs.add_cli_args(parser)
    if not require_model_path:  # doctor's own options check one SGLang argument at a time
        for action in parser._actions:
            if action.dest == "model_path":
                action.required = False
    return parser


def parse(argv: Sequence[str], *, require_model_path: bool = True) -> argparse.Namespace:
    """SGLang's parse of `argv`, `--config` YAML merged first as prepare_server_args merges it."""
    parser = sglang_parser(require_model_path=require_model_path)
    argv = list(argv)
    if "--config" in argv:
        from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger

        try:
            argv = ConfigArgumentMerger(parser).merge_config_with_args(argv)
        except (ValueError, OSError) as exc:
            raise LaunchLineError(f"--config: {exc}") from None
    return parser.parse_args(argv)


def server_args(ns: argparse.Namespace) -> Any:
    """The ServerArgs record a launch builds from `ns` (ServerArgs.from_cli_args, with the plugin's hooks on it)."""
    from sglang.srt.server_args import ServerArgs

    return ServerArgs.from_cli_args(ns)
