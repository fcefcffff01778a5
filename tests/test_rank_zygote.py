"""tests/rank_zygote.py, which the multi-process tests start their ranks with: each rank is a separate process that
gets its own argv, environment, working directory and log and starts with what the zygote imported; its exit status
comes back (a signal as -signum); a SIGKILL kills that rank and nothing else; a wait past its timeout raises; closing
the zygote leaves no rank behind."""

import json
import os
import signal
import textwrap
import time

import pytest

from rank_zygote import Zygote

SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    out = {"argv": sys.argv[1:], "env": os.environ.get("ZYGOTE_TEST"), "cwd": os.getcwd(), "pid": os.getpid(),
           "ppid": os.getppid(), "preloaded": "decimal" in sys.modules, "name": __name__}
    print(json.dumps(out), flush=True)
    if sys.argv[1] == "sleep":
        time.sleep(3600)  # until the test kills it (or the zygote's close does): never by running out
    sys.exit(int(sys.argv[2]))
""")


@pytest.fixture(scope="module")
def zygote():
    with Zygote(["decimal"], env=dict(os.environ, ZYGOTE_TEST="zygote")) as z:
        yield z


@pytest.fixture
def script(tmp_path):
    p = tmp_path / "rank.py"
    p.write_text(SCRIPT)
    return p


def test_a_rank_runs_as_its_own_process_with_its_argv_env_cwd_and_exit_status(zygote, script, tmp_path):
    r = zygote.spawn(path=script, argv=["exit", 3], log=tmp_path / "log", env={"ZYGOTE_TEST": "rank"},
                     cwd=str(tmp_path))
    assert r.wait(60) == 3 and r.poll() == 3
    got = json.loads(r.read_log().splitlines()[-1])
    assert got["argv"] == ["exit", "3"] and got["env"] == "rank" and got["cwd"] == str(tmp_path)
    assert got["name"] == "__main__" and got["preloaded"]  # started from the zygote's imports
    assert got["pid"] == r.pid and got["pid"] not in (os.getpid(), zygote.proc.pid)
    assert got["ppid"] == zygote.proc.pid  # forked by the zygote, not a thread of it


def test_sigkill_of_one_rank_kills_that_process_only(zygote, script, tmp_path):
    victim = zygote.spawn(path=script, argv=["sleep", 0], log=tmp_path / "victim")
    other = zygote.spawn(path=script, argv=["sleep", 0], log=tmp_path / "other")
    try:
        deadline = time.monotonic() + 60
        while not (victim.read_log() and other.read_log()):  # both running their script
            assert victim.poll() is None and other.poll() is None, (victim.read_log(), other.read_log())
            assert time.monotonic() < deadline, "a hang guard: the ranks never started their script"
            time.sleep(0.05)
        os.kill(victim.pid, signal.SIGKILL)
        assert victim.wait(30) == -signal.SIGKILL
        assert other.poll() is None and zygote.proc.poll() is None
    finally:
        other.kill()
    assert other.wait(30) == -signal.SIGKILL


def test_a_wait_past_its_timeout_raises_and_closing_the_zygote_leaves_no_rank(script, tmp_path):
    with Zygote([], env=dict(os.environ)) as z:
        r = z.spawn(path=script, argv=["sleep", 0], log=tmp_path / "log")
        with pytest.raises(TimeoutError):
            r.wait(0.5)
    with pytest.raises(ProcessLookupError):
        os.kill(r.pid, 0)  # gone (killed and reaped), not left running


@pytest.mark.slow
def test_the_sglang_python_parent_imported_sglang_but_never_the_plugin(sglang_python):
    code = ("import sys; print(sorted({m.split('.')[0] for m in sys.modules} & {'sglang', 'torch', 'sglang_glm_ext'}));"
            "sys.exit(5)")
    got = sglang_python.run(code=code, timeout=120)
    assert got.returncode == 5 and got.stdout.split("\n")[0] == "['sglang', 'torch']", (got.stdout, got.stderr)


@pytest.mark.gpu(reason="proves ranks from a zygote reach the GPU whatever its imports did: asking the device count "
                        "(on the H200's torch 2.11 this armed no fork poison: ranks fork) or making a CUDA context "
                        "(ranks then start fresh)")
@pytest.mark.parametrize("preload, poisons", [("import torch\nassert torch.cuda.device_count() > 0\n", None),
                                              ("import torch\ntorch.ones(1, device='cuda')\n", True)])
def test_ranks_from_a_zygote_reach_the_gpu_whatever_its_imports_did(tmp_path, preload, poisons):
    (tmp_path / "gpu_imports.py").write_text(preload)
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    code = "import torch; print(float(torch.ones(4, device='cuda').sum()))"
    with Zygote(["gpu_imports"], env=env) as z:
        if poisons is not None:
            assert z.cuda is poisons  # a context in the zygote: its probe must see the poison
        got = z.run(code=code, timeout=120)  # forked or fresh, as the zygote's probe decided
    assert got.returncode == 0 and got.stdout.strip() == "4.0", (z.cuda, got.stderr)


def test_a_zygote_holding_a_cuda_context_starts_each_rank_fresh_with_the_same_contract(script, tmp_path):
    """On a GPU machine SGLang's imports make a CUDA context in the zygote, which a forked child cannot use ("Cannot
    re-initialize CUDA in forked subprocess", seen on the lent H200): ranks then start as fresh interpreters, with the
    same argv, env, cwd, log, exit status and kill. Here the zygote's report is set as a GPU machine's would be."""
    with Zygote(["decimal"], env=dict(os.environ, ZYGOTE_TEST="zygote")) as z:
        assert z.cuda is False  # this CPU machine: no context, ranks fork
        z.cuda = True
        r = z.spawn(path=script, argv=["exit", 5], log=tmp_path / "log", env={"ZYGOTE_TEST": "rank"},
                    cwd=str(tmp_path))
        assert r.wait(60) == 5 and r.poll() == 5
        got = json.loads(r.read_log().splitlines()[-1])
        assert got["argv"] == ["exit", "5"] and got["env"] == "rank" and got["cwd"] == str(tmp_path)
        assert got["name"] == "__main__" and not got["preloaded"]  # a fresh interpreter, not the zygote's fork
        assert got["pid"] == r.pid and got["ppid"] == os.getpid()
        sleeper = z.spawn(path=script, argv=["sleep", 0], log=tmp_path / "sleeper")
        with pytest.raises(TimeoutError):
            sleeper.wait(0.5)
        assert os.getpgid(sleeper.pid) == sleeper.pid  # its own group: a kill reaches what it started
        sleeper.kill()
        assert sleeper.wait(30) == -signal.SIGKILL
