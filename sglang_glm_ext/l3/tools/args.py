"""Argument types the CLI's commands share: a bad number or size is argparse's one-line usage error, never a run
that starts on it (``l3 bench --size-gb -1``)."""

from __future__ import annotations

import argparse
import math
from typing import Any, Callable, Mapping

__all__ = ["positive_int", "non_negative_int", "positive_float", "config_value", "tighten"]


def _number(kind: type, text: str):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected {'a whole number' if kind is int else 'a number'}, got {text!r}") from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def positive_int(text: str) -> int:
    value = _number(int, text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = _number(int, text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def positive_float(text: str) -> float:
    value = _number(float, text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def config_value(key: str) -> Callable[[str], str]:
    """A type that checks TEXT as the L3 config reads ``key`` and keeps the text (the command writes it into a
    config); the config's own message, without its key path, is the usage error."""
    from ..config_table import L3ConfigError, key_parser

    parse = key_parser(key)

    def check(text: str) -> str:
        try:
            parse(text, key)
        except L3ConfigError as e:
            raise argparse.ArgumentTypeError(str(e).removeprefix(f"{key}: ")) from None
        return text

    check.__name__ = key.rpartition(".")[2]  # argparse names the type in "invalid <name> value"
    return check


def tighten(parser: argparse.ArgumentParser, types: Mapping[str, Callable[[str], Any]]) -> None:
    """Give options of a parser built elsewhere a checking type. Every option named must exist: a renamed one fails
    here, at parser build time, rather than going unchecked."""
    for option, kind in types.items():
        action = parser._option_string_actions[option]
        action.type = kind
