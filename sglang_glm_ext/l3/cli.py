"""``sglang-glm-ext l3 ...``: example-config, fsck, ls, bench. Wired into the main CLI by ``add_l3_subcommands``."""

from __future__ import annotations

import argparse
import errno
import os
import shlex
import sys

__all__ = ["add_l3_subcommands"]

# What to do about a directory example-config cannot write into, by errno (the rest: "choose another --dir").
_WRITE_FIXES = {
    errno.EROFS: "the file system is read-only: choose a --dir on a writable disk",
    errno.EACCES: "no permission: choose a --dir you may write to, or run as its owner",
    errno.EPERM: "not permitted: choose a --dir you may write to, or run as its owner",
    errno.ENOTDIR: "a part of that path is a file: choose another --dir",
    errno.ENOSPC: "the disk is full: free space or choose another --dir",
}


def _example_config(args: argparse.Namespace) -> int:
    from .config import L3Config, write_example_config
    from .tools.exit_codes import NOT_WRITTEN, REFUSED, WRITTEN

    d = os.path.abspath(args.dir)
    target = os.path.join(d, "l3.toml")
    try:
        path = write_example_config(d, force=args.force)
    except FileExistsError:
        if os.path.isdir(d):
            print(f"l3 example-config: {target} exists and was not changed; pass --force to replace it with the "
                  f"example", file=sys.stderr)
        else:
            print(f"l3 example-config: --dir {d} is a file, not a directory: choose another --dir", file=sys.stderr)
        return REFUSED  # what the arguments name cannot be used as they are, as tiny-model's non-empty directory
    except OSError as e:
        fix = _WRITE_FIXES.get(e.errno, "choose another --dir")
        where = f" ({e.filename})" if e.filename and os.path.abspath(e.filename) != target else ""
        print(f"l3 example-config: cannot write {target}{where}: {e.strerror or e}; {fix}", file=sys.stderr)
        return REFUSED if e.errno == errno.ENOTDIR else NOT_WRITTEN
    L3Config.from_file(path)  # never hand out a config we cannot load ourselves
    q = shlex.quote(path)
    print(f"wrote {path}; edit its disks (path, budget), deployment_id and cold_start for this node")
    print(f"next: python -m sglang.launch_server --model-path MODEL ... --enable-hierarchical-cache --enable-cp-l3 "
          f"--cp-l3-config {q}")
    print(f"check it first: sglang-glm-ext doctor --enable-cp-l3 --cp-l3-config {q}")
    return WRITTEN


def _fsck(args: argparse.Namespace) -> int:
    from .tools.fsck import run_args

    return run_args(args)


def _ls(args: argparse.Namespace) -> int:
    from .tools.ls import run_args

    return run_args(args)


def _bench(args: argparse.Namespace) -> int:
    from .tools.bench import run

    return int(run(args) or 0)


def _usage_status(parser: argparse.ArgumentParser, status: int) -> None:
    """Make ``parser``'s usage errors exit ``status`` (argparse's own is 2) with its usual one-line message, an
    unknown option included (argparse leaves that one to the top-level parser, whose status is 2)."""
    parse_known = parser.parse_known_args

    def error(message: str):
        parser.print_usage(sys.stderr)
        parser.exit(status, f"{parser.prog}: error: {message}\n")

    def parse_known_args(args=None, namespace=None):
        ns, extras = parse_known(args, namespace)
        if extras:
            error(f"unrecognized arguments: {' '.join(extras)}")
        return ns, extras

    parser.error = error  # type: ignore[method-assign]
    parser.parse_known_args = parse_known_args  # type: ignore[method-assign]


def _check_bench_args(be: argparse.ArgumentParser) -> None:
    """The bench's numbers and config values checked as it parses them (tools/bench.py declares them)."""
    from .tools import args as types

    types.tighten(be, {"--size-gb": types.positive_float, "--page-bytes": types.positive_int,
                       "--repeats": types.positive_int, "--batch-pages": types.positive_int,
                       "--staging-mb": types.positive_int, "--load-pages": types.non_negative_int,
                       "--fio-seconds": types.positive_float,
                       "--read-coalesce": types.config_value("queues.read_coalesce_bytes"),
                       "--gil-pause": types.config_value("queues.layer_first_gil_pause")})


def add_l3_subcommands(subparsers) -> argparse.ArgumentParser:
    """Add ``l3 {example-config,fsck,ls,bench}`` to the main CLI's subparsers; each sets ``func(args) -> int``."""
    from .tools import exit_codes
    from .tools.fsck import build_arg_parser
    from .tools.ls import build_arg_parser as build_ls_parser

    l3 = subparsers.add_parser("l3", help="L3 disk tier tools: example-config, fsck, ls, bench")
    sub = l3.add_subparsers(dest="l3_command", required=True)

    ex = sub.add_parser("example-config", help="write a small valid L3 config (l3.toml) that uses DIR",
                        epilog=exit_codes.epilog(exit_codes.EXAMPLE_CONFIG))
    ex.add_argument("--dir", required=True, help="directory for the config, the slabs and the index")
    ex.add_argument("--force", action="store_true", help="replace an existing DIR/l3.toml (refused without it)")
    ex.set_defaults(func=_example_config)

    fs = sub.add_parser("fsck", help="check index vs slabs, --repair what is wrong; exit 0 clean, 1 repaired, 4 errors "
                                     "left, 8 I/O error, 16 usage/config error", epilog=exit_codes.EPILOG)
    build_arg_parser(fs)
    _usage_status(fs, exit_codes.USAGE)
    fs.set_defaults(func=_fsck)

    ls = sub.add_parser("ls", help="what an index holds: deployments, ranks, kinds, pages and bytes, slabs per rank",
                        epilog=exit_codes.epilog(exit_codes.LS))
    build_ls_parser(ls)
    _usage_status(ls, exit_codes.USAGE)
    ls.set_defaults(func=_ls)

    be = sub.add_parser("bench", help="L3 spill/reload/exists vs raw O_DIRECT on one disk, printed as ratios",
                        epilog=exit_codes.epilog(exit_codes.BENCH))
    from .tools.bench import add_arguments

    add_arguments(be)
    _check_bench_args(be)
    be.set_defaults(func=_bench)
    return l3
