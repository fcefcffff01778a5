"""``sglang-glm-ext l3 ...``: example-config, fsck, bench. Wired into the main CLI by ``add_l3_subcommands``."""

from __future__ import annotations

import argparse

__all__ = ["add_l3_subcommands"]


def _example_config(args: argparse.Namespace) -> int:
    from .config import L3Config, write_example_config

    path = write_example_config(args.dir)
    L3Config.from_file(path)  # never hand out a config we cannot load ourselves
    print(path)
    return 0


def _fsck(args: argparse.Namespace) -> int:
    from .tools.fsck import run_args

    return run_args(args)


def _bench(args: argparse.Namespace) -> int:
    from .tools.bench import run

    return int(run(args) or 0)


def add_l3_subcommands(subparsers) -> argparse.ArgumentParser:
    """Add ``l3 {example-config,fsck,bench}`` to the main CLI's subparsers; each sets ``func(args) -> int``."""
    from .tools.fsck import build_arg_parser

    l3 = subparsers.add_parser("l3", help="L3 disk tier tools: example-config, fsck, bench")
    sub = l3.add_subparsers(dest="l3_command", required=True)

    ex = sub.add_parser("example-config", help="write a small valid L3 config (l3.toml) that uses DIR")
    ex.add_argument("--dir", required=True, help="directory for the config, the slabs and the index")
    ex.set_defaults(func=_example_config)

    fs = sub.add_parser("fsck", help="check index vs slabs; non-zero exit on corruption")
    build_arg_parser(fs)
    fs.set_defaults(func=_fsck)

    be = sub.add_parser("bench", help="L3 spill/reload/exists vs raw O_DIRECT on one disk, printed as ratios",
                        epilog="exit status: 0 every target met, 3 a row is FAIL (listed on stderr), 2 bad arguments")
    from .tools.bench import add_arguments

    add_arguments(be)
    be.set_defaults(func=_bench)
    return l3
