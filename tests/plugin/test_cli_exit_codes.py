"""Exit codes are one table (plugin/cli.py's EXIT_STATUS): docs/cli.md shows it, every command's help ends with its
row, and the commands return what it says: a refusal is 2 as tiny-model's is (an existing l3.toml included), a bad
number is a usage error before anything runs, the L3 store tools keep e2fsck's codes, a closed pipe is 141 with no
traceback, Ctrl-C is 130."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

from sglang_glm_ext.l3 import cli as l3_cli
from sglang_glm_ext.l3.tools import exit_codes
from sglang_glm_ext.plugin import cli
from sglang_glm_ext.plugin.cli import EXIT_STATUS, build_parser, command_name, exit_status_markdown, main

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def _leaves():
    top = build_parser()
    return [p for p in cli.subcommand_parsers(top)
            if not any(a.__class__.__name__ == "_SubParsersAction" for a in p._actions)]


def test_docs_cli_md_shows_the_table_the_code_has():
    text = DOC.read_text()
    m = re.search(r"<!-- exit-codes:begin[^\n]*-->\n(.*?)<!-- exit-codes:end -->", text, re.S)
    assert m, "docs/cli.md lost its exit-codes markers"
    assert m.group(1) == exit_status_markdown(), "regenerate docs/cli.md's table from plugin/cli.py:EXIT_STATUS"


def test_every_command_has_a_row_and_its_help_ends_with_it():
    names = {command_name(p): p for p in _leaves()}
    assert set(names) == set(EXIT_STATUS), "a command without a row, or a row without a command"
    for name, p in names.items():
        row = ", ".join(f"{code} {meaning}" for code, meaning in EXIT_STATUS[name])
        assert p.epilog.startswith(f"exit status: {row}"), (name, p.epilog)
        assert all(isinstance(code, int) for code, _ in EXIT_STATUS[name])
    assert EXIT_STATUS["l3 fsck"] == exit_codes.MEANINGS and EXIT_STATUS["l3 ls"] == exit_codes.LS


def _codes(name):
    return {code for code, _ in EXIT_STATUS[name]}


def test_example_config_refuses_an_existing_file_with_2_as_tiny_model_refuses_a_full_directory(tmp_path, capsys):
    d = str(tmp_path)
    assert main(["l3", "example-config", "--dir", d]) == 0
    assert main(["l3", "example-config", "--dir", d]) == exit_codes.REFUSED == 2
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "x").write_text("x")
    assert main(["tiny-model", "--arch", "glm5", str(tmp_path / "model")]) == 2
    assert {0, 2} <= _codes("l3 example-config") and 2 in _codes("tiny-model")


def test_manifest_that_cannot_write_is_1_with_one_line(tmp_path, capsys):
    assert main(["manifest", "--write", str(tmp_path / "no" / "such" / "dir.md")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot write" in err and "Traceback" not in err
    assert 1 in _codes("manifest")


@pytest.mark.parametrize("argv", [
    ["l3", "bench", "--size-gb", "-1"], ["l3", "bench", "--size-gb", "nan"], ["l3", "bench", "--repeats", "0"],
    ["l3", "bench", "--page-bytes", "4096", "0"], ["l3", "bench", "--load-pages", "-5"],
    ["l3", "bench", "--gil-pause", "sometimes"], ["l3", "bench", "--read-coalesce", "2GiB"],
    ["gpu-bringup", "run", "--dir", "x", "--turns", "0"], ["cpu-serve", "run", "--dir", "x", "--conversations", "-1"],
    ["tiny-model", "--arch", "glm5", "x", "--layers", "0"], ["doctor", "--hicache-size", "0"],
])
def test_a_bad_number_is_a_usage_error_before_anything_runs(argv, capsys, monkeypatch):
    monkeypatch.setattr(l3_cli, "_bench", lambda args: pytest.fail("the bench ran"))
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"error: argument {next(a for a in argv if a.startswith('--') and a != '--dir' and a != '--arch')}" in err


def test_the_l3_store_tools_keep_e2fsck_codes_for_usage_and_config_errors(tmp_path, capsys):
    assert main(["l3", "ls", str(tmp_path)]) == exit_codes.USAGE  # a directory without an index
    assert main(["l3", "fsck", str(tmp_path / "none.toml")]) == exit_codes.USAGE
    with pytest.raises(SystemExit) as e:
        main(["l3", "fsck", "--bogus"])
    assert e.value.code == exit_codes.USAGE
    assert exit_codes.USAGE in _codes("l3 fsck") and exit_codes.USAGE in _codes("l3 ls")


def test_ctrl_c_is_130_without_a_traceback(monkeypatch, capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(l3_cli, "_example_config", interrupted)
    assert main(["l3", "example-config", "--dir", "x"]) == cli.INTERRUPTED == 130
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["flags"], ["l3", "ls", "{cfg}", "--json"], ["l3", "fsck", "{cfg}"],
                                  ["manifest"]])
def test_output_into_a_closed_pipe_is_141_without_a_traceback(tmp_path, argv):
    assert main(["l3", "example-config", "--dir", str(tmp_path)]) == 0
    argv = [a.replace("{cfg}", str(tmp_path / "l3.toml")) for a in argv]
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first byte: every write is EPIPE
    try:
        proc = subprocess.run([sys.executable, "-m", "sglang_glm_ext.cli", *argv], stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)
    assert proc.returncode == cli.PIPE_CLOSED == 141, proc.stderr
    assert proc.stderr == "", proc.stderr
