"""`sglang-glm-ext` as a user types it: --version, help lines with defaults for every option of every subcommand,
`l3 bench`'s exit status, and no SGLang import-time warnings unless -v."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import re
import subprocess
import sys

import pytest

from sglang_glm_ext.plugin import __version__
from sglang_glm_ext.plugin.cli import build_parser, default_shown, main, subcommand_parsers


def cli(*args, env=None, timeout=300):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "sglang_glm_ext.cli", *args], capture_output=True, text=True,
                          env=full_env, timeout=timeout)


def test_version_is_the_installed_distributions():
    proc = cli("--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"sglang-glm-ext {__version__}"
    assert __version__ == importlib.metadata.version("sglang-glm-ext")  # pyproject.toml and the package agree


def _options(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if action.option_strings and not isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            yield action


def _all_parsers():
    top = build_parser()
    return [top, *subcommand_parsers(top)]


def test_every_subcommand_is_reached_by_the_walk():
    names = {p.prog.removeprefix("sglang-glm-ext").strip() for p in _all_parsers()}
    assert {"", "doctor", "flags", "manifest", "l3", "l3 fsck", "l3 ls", "l3 bench", "l3 example-config", "demo"} <= names


@pytest.mark.parametrize("parser", _all_parsers(), ids=lambda p: p.prog)
def test_every_option_has_a_help_line_that_shows_its_default(parser):
    text = " ".join(parser.format_help().split())  # argparse wraps lines: compare with whitespace folded
    for action in _options(parser):
        name = "/".join(action.option_strings)
        assert action.help and action.help.strip(), f"{parser.prog} {name}: no help line"
        shown = default_shown(action)
        if shown is None:
            continue
        own = " ".join(action.help.split())
        if "default:" in own.lower():  # the help words its default itself (e.g. "default: a temporary directory")
            continue
        assert f"(default: {shown})" in text, f"{parser.prog} {name}: default {shown!r} not in --help"


def test_bench_dir_default_is_in_its_help(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["l3", "bench", "--help"])
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--dir DIR directory on the disk under test (default: /tmp/l3_bench)" in out
    assert "exit status: 0 every target met, 2 usage error (a bad number included), 3 the bench ran and a row is " \
           "FAIL" in out


def test_plugin_path_flags_show_a_kind_not_the_carriers_dest(capsys):
    with pytest.raises(SystemExit):
        main(["doctor", "--help"])
    out = capsys.readouterr().out
    assert "--cp-l3-config PATH" in out and "GLM_EXT__" not in out


# ---- l3 bench: a FAIL row is a non-zero exit ----

def _load(s_per_million):
    return {"pages": 10, "page_bytes": 3968, "slot_bytes": 4096, "open_empty_s": [0.01], "open_load_s": [0.02],
            "fill_s": 0.1, "s_per_million": s_per_million}


@pytest.mark.parametrize("s_per_million, status", [(50.0, 3), (1.0, 0)])
def test_l3_bench_exits_3_when_a_row_is_fail(monkeypatch, tmp_path, capsys, s_per_million, status):
    from sglang_glm_ext.l3.tools import bench

    monkeypatch.setattr(bench, "bench_load", lambda args: _load(s_per_million))
    rc = main(["l3", "bench", "--dir", str(tmp_path), "--skip-throughput", "--load-pages", "10"])
    out, err = capsys.readouterr()
    assert rc == status
    row = next(line for line in out.splitlines() if "cold_start=load, 10 live pages" in line)
    assert row.rstrip().endswith("FAIL" if status else "PASS")
    if status:
        assert re.search(r"l3 bench: 1 target\(s\) missed on .*: 3968 cold_start=load, 10 live pages 50\.00s/Mpg "
                         r"\(target <=10s\)", err), err
    else:
        assert "missed" not in err


# ---- SGLang's import-time warnings ----

NOISE = ("UserWarning", "Only CUDA", "Triton is not supported", "Cannot detect CUDA architecture")


@pytest.mark.slow
def test_sglangs_import_warnings_are_hidden_unless_verbose():
    quiet = cli("doctor", "--brief")
    assert quiet.stdout.startswith("sglang-glm-ext "), quiet.stdout + quiet.stderr[-2000:]
    assert not [n for n in NOISE if n in quiet.stderr], quiet.stderr
    loud = cli("-v", "doctor", "--brief")
    assert loud.stdout.splitlines()[0] == quiet.stdout.splitlines()[0]
    assert "Cannot detect CUDA architecture" in loud.stderr and "UserWarning" in loud.stderr, loud.stderr[-2000:]


def test_main_in_a_process_leaves_its_logging_and_warnings_as_they_were(tmp_path, capsys):
    import logging
    import warnings

    before = (logging.getLogger("sglang").level, list(warnings.filters))
    assert main(["flags"]) == 0
    assert (logging.getLogger("sglang").level, list(warnings.filters)) == before
