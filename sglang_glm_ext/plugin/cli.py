"""`sglang-glm-ext`: doctor, flags, the patch manifest, the L3 tools, and the L3 HiCache demo."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    from . import flags

    parser = argparse.ArgumentParser(prog="sglang-glm-ext", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    doc = sub.add_parser("doctor", help="versions, patch states, feature states, hardware; non-zero on problems")
    doc.add_argument("--json", action="store_true",
                     help="stable JSON output (schema in sglang_glm_ext/plugin/doctor.py)")
    doc.add_argument("--brief", action="store_true", help="one line")
    flags.add_arguments(doc)  # `doctor --enable-cp-l3 --cp-l3-config x.toml` checks what that launch would need

    sub.add_parser("flags", help="list the plugin's CLI flags and environment variables")

    man = sub.add_parser("manifest", help="print docs_internal/patch_manifest.md from the patch declarations")
    man.add_argument("--write", metavar="PATH", help="write it to PATH instead of stdout")

    try:
        from ..l3.cli import add_l3_subcommands
    except ImportError:
        add_l3_subcommands = None
    if add_l3_subcommands is not None:
        add_l3_subcommands(sub)
    from ..l3.hicache.demo import add_demo_subcommand  # the main job: L3 under SGLang's real HiCache on a CPU

    add_demo_subcommand(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "doctor":
        from .doctor import main as doctor_main

        return doctor_main(args)
    if args.command == "flags":
        from .docs import flags_table

        sys.stdout.write(flags_table())
        return 0
    if args.command == "manifest":
        from ..patching.manifest import render
        from .registry import PATCHES

        text = render(PATCHES)
        if args.write:
            with open(args.write, "w") as f:
                f.write(text)
        else:
            sys.stdout.write(text)
        return 0
    if args.command == "demo":
        from ..l3.hicache.demo import run_demo
        from .register import register

        return run_demo(args, register)
    handler = getattr(args, "func", None)
    if handler is None:
        parser.error(f"unknown command {args.command}")
    return int(handler(args) or 0)
