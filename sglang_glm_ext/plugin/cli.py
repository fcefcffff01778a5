"""`sglang-glm-ext`: doctor, flags, the patch manifest, the L3 tools, the L3 HiCache demo, and the CPU serving mode's
tiny-model generator and served run."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import warnings
from typing import Any, Callable, Iterator

from ..l3.tools import exit_codes
from ..l3.tools.args import positive_float, positive_int, tighten
from . import __version__

# Building the parser and running --version, --help, flags and the l3 tools imports neither torch nor SGLang (a
# subprocess test checks it): a subcommand imports what it needs inside its func, and a module the parser imports
# keeps torch inside the functions that use it.

# What each command's exit status means: its help epilog and docs/cli.md's table (tests/plugin/test_cli_exit_codes.py
# keeps them equal and checks the codes the commands return). One rule but for the L3 store tools: 0 done or clean,
# 1 it ran and something failed (doctor's problems, a failed check, a write the system refused), 2 refused before it
# started (a usage error, or arguments that name what cannot be used as they are). l3 fsck / ls keep e2fsck's codes so
# a script tells "repaired" from "still broken" from "could not look"; l3 bench's 3 tells a missed target from a crash.
USAGE = "usage error"
EXIT_STATUS: dict[str, tuple[tuple[int, str], ...]] = {
    "doctor": ((0, "no problem found"), (1, "problems found (each with its fix)"),
               (2, f"{USAGE}, or a launch line it cannot read")),
    "flags": ((0, "printed"), (2, USAGE)),
    "manifest": ((0, "printed or written"), (1, "--write could not write the file"), (2, USAGE)),
    "l3 example-config": exit_codes.EXAMPLE_CONFIG,
    "l3 fsck": exit_codes.MEANINGS,
    "l3 ls": exit_codes.LS,
    "l3 bench": exit_codes.BENCH,
    "demo": ((0, "every byte matched"), (1, "a check failed"),
             (2, f"{USAGE}, or not run here (a GPU is visible, or the plugin is disabled)")),
    "tiny-model": ((0, "written"), (2, f"{USAGE}, or DIR is not empty (--force writes into it) or is a file")),
    "cpu-serve run": ((0, "every check passed"), (1, "a check failed (listed at the end)"), (2, USAGE)),
    "gpu-bringup run": ((0, "every check passed"), (1, "a check failed (listed at the end)"), (2, USAGE)),
}
INTERRUPTED, PIPE_CLOSED = 130, 141  # as a shell reports a command killed by SIGINT / SIGPIPE
EVERY_COMMAND = ((INTERRUPTED, "interrupted (Ctrl-C)"),
                 (PIPE_CLOSED, "whoever read its output stopped early (a pipe into head): no traceback"))


def exit_status_markdown() -> str:
    """docs/cli.md's table: every command, each exit status it can end with and what it means."""
    rows = ["| command | exit status |", "|---|---|"]
    rows += [f"| `{name}` | " + "; ".join(f"{code} {meaning}" for code, meaning in codes) + " |"
             for name, codes in EXIT_STATUS.items()]
    rows.append("| every command | " + "; ".join(f"{code} {meaning}" for code, meaning in EVERY_COMMAND) + " |")
    return "\n".join(rows) + "\n"


class HelpFormatter(argparse.HelpFormatter):
    """Every option's help line ends with its default, as argparse's ArgumentDefaultsHelpFormatter does, but not
    for an off switch or an unset option (`default: None` / `False` say nothing), and not twice when the help
    already says what the default is."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        shown = default_shown(action)
        if shown is None or "%(default)" in text or "default:" in text.lower():
            return text
        return f"{text} (default: {shown.replace('%', '%%')})"


def default_shown(action: argparse.Action) -> str | None:
    """How an option's default reads in its help line; None when there is nothing to show."""
    default = action.default
    if not action.option_strings or default in (None, False, argparse.SUPPRESS) or action.nargs == 0:
        return None
    if isinstance(default, (list, tuple)):
        return " ".join(map(str, default))
    return str(default)


class ArgumentParser(argparse.ArgumentParser):
    """The plugin's parser: its help shows defaults (HelpFormatter). Subcommand parsers are made from the same
    class (argparse's add_subparsers uses the parent's class), so every subcommand, a feature folder's included,
    gets it without asking."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


# ---- the subcommands: each adder adds one (or a group) to `sub` and sets its func(args) -> exit status ----

def _add_doctor(sub) -> None:
    from . import flags
    from .registry import SGLANG_ARGS

    doc = sub.add_parser(
        "doctor", help="versions, patch states, feature states, hardware; non-zero on problems",
        description="What is installed, what the plugin did to SGLang, and whether a launch would work here. "
                    "Check a launch by giving its whole command line after `--` (SGLang's own parser reads it, "
                    "with the plugin's flags), or by the few options below.",
        epilog="example: sglang-glm-ext doctor -- python -m sglang.launch_server --model-path zai-org/GLM-5 "
               "--enable-hierarchical-cache --enable-cp-l3 --cp-l3-config l3.toml --moe-a2a-backend megamoe")
    doc.add_argument("--json", action="store_true",
                     help="stable JSON output (schema in sglang_glm_ext/plugin/doctor.py)")
    doc.add_argument("--brief", action="store_true", help="one line")
    flags.add_arguments(doc)  # `doctor --enable-cp-l3 --cp-l3-config x.toml` checks what that launch would need
    # SGLang-side values of the launch (not plugin flags): they reach the doctor parts as DoctorInput.launch.
    launch = doc.add_argument_group("launch", "SGLang settings of the launch to check, without its whole command "
                                    "line: they size a hugepage-backed HiCache launch (SGLANG_HUGEPAGE_SIZE) and "
                                    "switch SGLang-switched features on (megamoe)")
    launch.add_argument("--hicache-size", type=positive_int, default=None, metavar="GB",
                        help="the launch's --hicache-size (GB per rank): whether the node's hugepages hold it")
    launch.add_argument("--ranks-per-node", type=positive_int, default=None, metavar="N",
                        help="scheduler ranks on this node (tp*pp*dp / nnodes); default: from the launch line, "
                             "else visible GPUs, else 1")
    # SGLang's own switches of a feature (`doctor --moe-a2a-backend megamoe`); they reach doctor as DoctorInput.launch
    for name in SGLANG_ARGS:
        opt = "--" + name.replace("_", "-")
        launch.add_argument(opt, dest=name, default=None, metavar="VALUE",
                            help=f"the launch's SGLang {opt}, checked against the installed SGLang's choices "
                                 "(a feature it switches on shows active)")
    doc.add_argument("launch_line", nargs=argparse.REMAINDER, metavar="-- LAUNCH",
                     help="the launch's whole command line: `python -m sglang.launch_server ARGS`, "
                          "`sglang serve ARGS`, or just ARGS; leading NAME=VALUE words set environment variables "
                          "for the check")

    def run(args) -> int:
        from .doctor import main as doctor_main

        return doctor_main(args)

    doc.set_defaults(func=run)


def _add_flags(sub) -> None:
    p = sub.add_parser("flags", help="list the plugin's CLI flags and environment variables")

    def run(args) -> int:
        from .docs import flags_table

        sys.stdout.write(flags_table())
        return 0

    p.set_defaults(func=run)


def _add_manifest(sub) -> None:
    man = sub.add_parser("manifest", help="print docs_internal/patch_manifest.md from the patch declarations")
    man.add_argument("--write", metavar="PATH", help="write it to PATH instead of stdout")

    def run(args) -> int:
        from ..patching.manifest import render
        from .registry import PATCHES

        text = render(PATCHES)
        if args.write:
            try:
                with open(args.write, "w") as f:
                    f.write(text)
            except OSError as e:
                print(f"sglang-glm-ext manifest: cannot write {args.write}: {e.strerror or e}", file=sys.stderr)
                return 1
        else:
            sys.stdout.write(text)
        return 0

    man.set_defaults(func=run)


def _add_l3(sub) -> None:
    try:
        from ..l3.cli import add_l3_subcommands  # sets func on each of its subcommands
    except ImportError:
        return
    add_l3_subcommands(sub)


def _add_demo(sub) -> None:
    from ..l3.demo.run import add_demo_subcommand  # the main job: L3 under SGLang's real HiCache on a CPU

    add_demo_subcommand(sub)

    def run(args) -> int:
        from ..l3.demo.run import run_demo
        from .register import register

        return run_demo(args, register)

    sub.choices["demo"].set_defaults(func=run)


def _add_cpu_serve(sub) -> None:
    from ..cpu_serve import run as cpu_serve_run, tiny_model  # SGLang's real server on a CPU (cpu_serve/)

    tiny_model.add_subcommand(sub)
    cpu_serve_run.add_subcommand(sub)
    # Their numbers checked as they are parsed (a run never starts on --turns 0 or a negative timeout).
    tighten(sub.choices["tiny-model"], {o: positive_int for o in ("--hidden", "--layers", "--experts", "--context")})
    tighten(_run_parser(sub, "cpu-serve"), {"--conversations": positive_int, "--turns": positive_int,
                                            "--server-timeout": positive_float})


def _run_parser(sub, name: str) -> argparse.ArgumentParser:
    """The `run` parser of a `NAME run` group."""
    (inner,) = [a for a in sub.choices[name]._actions if isinstance(a, argparse._SubParsersAction)]
    return inner.choices["run"]


def _add_gpu_bringup(sub) -> None:
    """`gpu-bringup run`: the served run on a CUDA GPU with the bring-up tier (gpu_bringup/served.py), through the
    CPU run's driver with the GPU's arguments; on a GPU node whose torch sgl-kernel matches, run it without the
    tier (a real sgl_kernel refuses the tier)."""
    p = sub.add_parser("gpu-bringup", help="SGLang's real server on a CUDA GPU without sgl-kernel (bring-up, tests)")
    inner = p.add_subparsers(dest="gpu_bringup_command", required=True)
    r = inner.add_parser("run", help="serve a tiny GLM with pinned HiCache pools + L3 on the GPU, restart, replay, "
                         "CUDA graphs, compare, fsck")
    r.add_argument("--dir", required=True, help="work directory (model, L3 config and disk, server logs)")
    r.add_argument("--arch", choices=("glm5", "glm4_moe"), default="glm5", help="tiny model (default glm5)")
    r.add_argument("--layout", choices=("layer_first", "page_first"), default="layer_first",
                   help="HiCache host pool layout (--hicache-mem-layout)")
    r.add_argument("--io-backend", choices=("kernel", "direct"), default="kernel", help="--hicache-io-backend")
    r.add_argument("--dtype", default="float32", help="model dtype (float32: greedy ids compare across restarts)")
    r.add_argument("--no-cuda-graphs", action="store_true", help="leave out the CUDA-graph phase")
    r.add_argument("--conversations", type=positive_int, default=3,
                   help="multi-turn conversations in the workload (they share one system prompt)")
    r.add_argument("--turns", type=positive_int, default=3, help="user turns per conversation")
    r.add_argument("--server-timeout", type=positive_float, default=420.0,
                   help="seconds a server may take to be ready")

    def run(a) -> int:
        from ..cpu_serve import run as serve_run
        from ..gpu_bringup import served as gpu_served

        prof = serve_run.Profile(**gpu_served.profile(a.layout, dtype=a.dtype, io_backend=a.io_backend))
        return serve_run.run(a.dir, conversations=a.conversations, turns=a.turns, server_timeout=a.server_timeout,
                             log=lambda s: print(s, flush=True), profile=prof, arch=a.arch,
                             extra_phases=None if a.no_cuda_graphs else gpu_served.graph_phase)

    r.set_defaults(func=run)


SUBCOMMANDS: tuple[Callable[[Any], None], ...] = (_add_doctor, _add_flags, _add_manifest, _add_l3, _add_demo,
                                                  _add_cpu_serve, _add_gpu_bringup)


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="sglang-glm-ext", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="also print SGLang's own warnings and log lines (hidden by default)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in SUBCOMMANDS:
        add(sub)
    for p in subcommand_parsers(parser):  # `sglang-glm-ext doctor -v` as well as `sglang-glm-ext -v doctor`
        if not {"-v", "--verbose"} & set(p._option_string_actions):
            p.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS,
                           help="also print SGLang's own warnings and log lines")
        codes = EXIT_STATUS.get(command_name(p))
        text = exit_codes.epilog(codes) if codes is not None else None
        if text is not None and not (p.epilog or "").startswith(text):  # fsck's says more ("as e2fsck's")
            p.epilog = f"{text}. {p.epilog}" if p.epilog else text  # before doctor's example
    return parser


def command_name(parser: argparse.ArgumentParser) -> str:
    """`l3 fsck` for the parser of `sglang-glm-ext l3 fsck`."""
    return parser.prog.split(" ", 1)[1] if " " in parser.prog else ""


def subcommand_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every subcommand's parser under `parser`, nested ones (`l3 fsck`) included."""
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for p in dict.fromkeys(action.choices.values()):
                out.append(p)
                out.extend(subcommand_parsers(p))
    return out


@contextlib.contextmanager
def quiet_sglang() -> Iterator[None]:
    """While a command runs, hide what SGLang prints about itself on this node when its modules are imported
    (UserWarnings that AWQ, GGUF and Triton need CUDA, "Cannot detect CUDA architecture", ...): the plugin's
    commands report on their own, and those lines came before every doctor and demo run. SGLang's errors still
    show; -v shows everything. Restored afterwards, so `main()` called in a process leaves its logging as it was."""
    logger = logging.getLogger("sglang")
    level = logger.level
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module=r"sglang(\.|$)")
        logger.setLevel(logging.ERROR)
        try:
            yield
        finally:
            logger.setLevel(level)


def main(argv: list[str] | None = None) -> int:
    try:
        try:
            args = build_parser().parse_args(argv)  # --help and --version exit from here
            with contextlib.nullcontext() if getattr(args, "verbose", 0) else quiet_sglang():
                return int(args.func(args) or 0)
        finally:
            sys.stdout.flush()  # here, not at exit: a closed pipe is then ours to answer
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return INTERRUPTED
    except BrokenPipeError:
        _drop_stdout()
        return PIPE_CLOSED


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush of what is still buffered finds no closed pipe
    (Python's own advice for SIGPIPE); a stdout without a file descriptor (a test's capture) is left alone."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)
