"""`sglang-glm-ext`: doctor, flags, the patch manifest, the L3 tools, the L3 HiCache demo, and the CPU serving mode's
tiny-model generator and served run."""

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
    # SGLang-side values of the launch (not plugin flags): they reach the doctor parts as DoctorInput.launch.
    launch = doc.add_argument_group("launch", "SGLang settings of the launch to check: they size a "
                                    "hugepage-backed HiCache launch (SGLANG_HUGEPAGE_SIZE) and switch "
                                    "SGLang-switched features on (megamoe)")
    launch.add_argument("--hicache-size", type=_positive_int, default=None, metavar="GB",
                        help="the launch's --hicache-size (GB per rank): whether the node's hugepages hold it")
    launch.add_argument("--ranks-per-node", type=_positive_int, default=None, metavar="N",
                        help="scheduler ranks on this node (tp*pp*dp / nnodes); default: visible GPUs, else 1")
    from .registry import SGLANG_ARGS

    # SGLang's own switches of a feature (`doctor --moe-a2a-backend megamoe`); they reach doctor as DoctorInput.launch
    for name in SGLANG_ARGS:
        launch.add_argument("--" + name.replace("_", "-"), dest=name, default=None,
                         help=f"the launch's SGLang --{name.replace('_', '-')} (a feature it switches on shows active)")

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
    from ..cpu_serve import run as cpu_serve_run, tiny_model  # SGLang's real server on a CPU (cpu_serve/)

    tiny_model.add_subcommand(sub)
    cpu_serve_run.add_subcommand(sub)
    return parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


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
