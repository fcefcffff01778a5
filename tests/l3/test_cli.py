"""`sglang-glm-ext l3 example-config` as an operator meets it: an edited l3.toml is never overwritten without
--force, a --dir it cannot write is one line naming the fix (a file, no permission, a read-only file system), and
it prints the next step: the launch line. Exit 2 when the arguments name what cannot be used as it is (l3.toml
exists, a file where a directory goes), 1 when the system refuses the write (docs/cli.md)."""

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_glm_ext.l3.cli import add_l3_subcommands

REPO = str(Path(__file__).resolve().parents[2])


def run(*argv):
    parser = argparse.ArgumentParser()
    add_l3_subcommands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["l3", "example-config", *argv])
    return args.func(args)


def one_line(err: str) -> str:
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_prints_the_path_and_the_launch_line_that_uses_it(tmp_path, capsys):
    assert run("--dir", str(tmp_path)) == 0
    path = tmp_path / "l3.toml"
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"wrote {path};")
    launch = next(line for line in out if line.startswith("next: python -m sglang.launch_server"))
    assert launch.endswith(f"--enable-hierarchical-cache --enable-cp-l3 --cp-l3-config {path}")
    assert any(line.endswith(f"sglang-glm-ext doctor --enable-cp-l3 --cp-l3-config {path}") for line in out)


def test_an_edited_config_is_not_overwritten_without_force(tmp_path, capsys):
    assert run("--dir", str(tmp_path)) == 0
    path = tmp_path / "l3.toml"
    path.write_text(path.read_text().replace('deployment_id = "example"', 'deployment_id = "mine"'))
    capsys.readouterr()
    assert run("--dir", str(tmp_path)) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = one_line(captured.err)
    assert str(path) in err and "--force" in err
    assert 'deployment_id = "mine"' in path.read_text()
    assert run("--dir", str(tmp_path), "--force") == 0
    assert 'deployment_id = "example"' in path.read_text()


def test_a_dir_that_is_a_file_is_one_line(tmp_path, capsys):
    f = tmp_path / "afile"
    f.write_text("x")
    assert run("--dir", str(f)) == 2
    assert "is a file, not a directory" in one_line(capsys.readouterr().err)
    assert run("--dir", str(f / "sub")) == 2
    assert "a part of that path is a file" in one_line(capsys.readouterr().err)


@contextlib.contextmanager
def unprivileged():
    """Mode bits apply (root ignores them): as root, drop the effective uid to nobody for the block."""
    if os.geteuid() != 0:
        yield
        return
    os.seteuid(65534)
    try:
        yield
    finally:
        os.seteuid(0)


def test_no_permission_is_one_line_naming_the_fix(tmp_path, capsys):
    d = tmp_path / "locked"
    d.mkdir(mode=0o755)
    os.chmod(tmp_path, 0o755)
    with unprivileged():
        rc = run("--dir", str(d))
    assert rc == 1 and not (d / "l3.toml").exists()
    err = one_line(capsys.readouterr().err)
    assert "Permission denied" in err and "choose a --dir you may write to" in err


def test_a_read_only_file_system_is_one_line_naming_the_fix(tmp_path):
    """A real read-only mount (a tmpfs mounted ro in a private mount namespace of the child)."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("mounting a read-only file system needs root and unshare(1)")
    mnt = tmp_path / "ro"
    mnt.mkdir()
    code = ("import argparse, sys; from sglang_glm_ext.l3.cli import add_l3_subcommands;"
            "p = argparse.ArgumentParser(); add_l3_subcommands(p.add_subparsers(dest='c'));"
            f"a = p.parse_args(['l3', 'example-config', '--dir', {str(mnt / 'sub')!r}]); sys.exit(a.func(a))")
    script = f"mount -t tmpfs -o ro,size=1m tmpfs {mnt} || exit 99; exec {sys.executable} -c \"{code}\""
    proc = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": REPO})
    if proc.returncode == 99:
        pytest.skip(f"cannot mount here: {proc.stderr.strip()}")
    assert proc.returncode == 1, proc.stderr
    err = one_line(proc.stderr)
    assert "Read-only file system" in err and "choose a --dir on a writable disk" in err
