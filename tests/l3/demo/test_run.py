"""`sglang-glm-ext demo` runs end to end on this CPU and fails loudly when bytes do not come back; it refuses to
check nothing; its work directory is removed, kept (--keep) or the caller's (--dir) as the README says."""

import argparse
import os
import subprocess
import sys

import pytest

from sglang_glm_ext.l3.demo import run as demo_run


@pytest.mark.slow
def test_demo_runs_every_phase_and_checks_bytes(sglang_python, tmp_path):
    # `sglang-glm-ext demo` in a process of its own (forked from a parent that imported SGLang only)
    proc = sglang_python.run(module="sglang_glm_ext.cli", timeout=900, env=dict(os.environ),
                             argv=["demo", "--requests", "2", "--pages", "2", "--layers", "8", "--dir",
                                   str(tmp_path / "w"), "--keep"])
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    for phase in ("write-back to L3", "L2 eviction", "prefetch from L3", "restart (cold_start=load)",
                  "prefetch after restart"):
        assert phase in out
    assert "8 pages durable" in out and "hits 256/256 tokens" in out and "GB/s" in out
    assert out.count("bytes exact after load-back") == 2 and out.rstrip().endswith("before and after the restart")
    assert (tmp_path / "w" / "l3.toml").exists()  # --keep leaves the slabs, index and config for fsck


def test_demo_refuses_where_a_gpu_is_visible():
    code = ("import torch, sys; torch.cuda.is_available = lambda: True;"
            "from sglang_glm_ext.cli import main; sys.exit(main(['demo']))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2 and "CUDA device is visible" in proc.stderr


@pytest.mark.slow
def test_demo_fails_when_a_page_claims_a_hit_without_its_bytes(sglang_python):
    # An engine that reports every reload as a hit but writes nothing: completion and hit counts look fine, the
    # byte check must still fail the demo.
    code = ("import sys; from sglang_glm_ext.l3.engine import store as s;"
            "s.L3Store.reload_into_layout = lambda self, kind, keys, layout, pages: [True] * len(keys);"
            "from sglang_glm_ext.cli import main;"
            "sys.exit(main(['demo', '--requests', '1', '--pages', '2', '--layers', '4']))")
    proc = sglang_python.run(code=code, env=dict(os.environ), timeout=900)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "FAILED" in proc.stdout and "DIFFER" in proc.stdout


def _parser():
    parser = argparse.ArgumentParser()
    demo_run.add_demo_subcommand(parser.add_subparsers(dest="command"))
    return parser


@pytest.mark.parametrize("option", ["--requests", "--pages", "--layers"])
def test_demo_refuses_to_check_nothing(option, capsys):
    """`demo --requests 0` printed "OK: every KV and indexer byte came back" over zero pages."""
    with pytest.raises(SystemExit) as exc:
        _parser().parse_args(["demo", option, "0"])
    assert exc.value.code == 2
    assert f"{option}: must be at least 1 (0 would check nothing), got 0" in capsys.readouterr().err
    assert getattr(_parser().parse_args(["demo", option, "1"]), option[2:]) == 1


@pytest.mark.parametrize("argv, kept", [([], False), (["--keep"], True), (["--dir", "{d}"], True),
                                        (["--dir", "{d}", "--keep"], True)])
def test_demo_work_dir_is_removed_unless_kept_and_a_given_dir_is_never_removed(argv, kept, tmp_path, monkeypatch,
                                                                               capsys):
    """What the README says of `--keep` and `--dir`, on run_demo itself (the demo's phases are stood in for)."""
    import os

    from sglang_glm_ext.l3.demo import cpu_standins

    given = tmp_path / "given"
    seen = []

    def fake_run(args, work, register):
        open(os.path.join(work, "l3.toml"), "w").close()
        seen.append(work)
        return 0

    monkeypatch.setattr(cpu_standins, "refusal_reason", lambda: "")
    monkeypatch.setattr(demo_run, "_run", fake_run)
    monkeypatch.setattr(demo_run.tempfile, "mkdtemp", lambda prefix: str(tmp_path / "temp"))
    (tmp_path / "temp").mkdir()
    args = _parser().parse_args(["demo", *[a.format(d=given) for a in argv]])
    assert demo_run.run_demo(args, register=None) == 0
    (work,) = seen
    assert work == str(given if "--dir" in argv else tmp_path / "temp")
    assert os.path.exists(os.path.join(work, "l3.toml")) is kept
