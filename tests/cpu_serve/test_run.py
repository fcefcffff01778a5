"""cpu_serve/run.py's served run without SGLang: its phases in order over stand-in servers, and each failure it must
report (a replay that differs, zero storage hits, a negative control that sees nothing, a failing fsck). The real
run, through SGLang's server, is the main job's (scripts/main.sh) and tests/server/'s."""

from __future__ import annotations

import json
import subprocess

import pytest

from sglang_glm_ext.cpu_serve import run as serve_run, served


class _FakeServer:
    """Stands in for ``served.Server``: replies are a function of the prompt, perturbed where the profile's switch
    is set; L3 servers after the first report storage hits."""

    started: list = []

    def __init__(self, model, log_path, *, args=(), env=None, base_args=(), base_env=None):
        self.log_path, self.args, self.env = log_path, tuple(args), dict(env or {})
        self.l3 = "--enable-cp-l3" in self.args
        self.url = f"fake://{len(_FakeServer.started)}"
        _FakeServer.started.append(self)

    def start_ready(self, timeout, progress=None):
        return 0.0

    def stop(self):
        pass


@pytest.fixture
def fake(monkeypatch, tmp_path):
    _FakeServer.started = []
    world = {"perturb_ignored": False, "no_hits_after_restart": False, "fsck_rc": 0}

    def chat(url, messages):
        srv = next(s for s in _FakeServer.started if s.url == url)
        l3_servers = [s for s in _FakeServer.started if s.l3]
        restarted = srv.l3 and l3_servers.index(srv) > 0
        storage = 100 if restarted and not world["no_hits_after_restart"] else 0
        ids = [len(json.dumps(messages)) % 97, len(messages)]
        if srv.env.get(serve_run.CPU.perturb_env) == "1" and not world["perturb_ignored"]:
            ids = [i + 1 for i in ids]
        return served.Reply(prompt_tokens=10, output_ids=ids, cached={"device": 5, "host": 0, "storage": storage},
                            ttft_s=0.01, e2e_s=0.02)

    monkeypatch.setattr(served, "Server", _FakeServer)
    monkeypatch.setattr(served, "chat", chat)
    monkeypatch.setattr(served, "wait_counter_settled", lambda url, name: 7.0)
    monkeypatch.setattr(served, "scrape", lambda url: {serve_run.RELOAD: 3.0})
    monkeypatch.setattr(serve_run, "_flush", lambda url: None)
    monkeypatch.setattr(serve_run.tiny_model, "write", lambda arch, path, mla: None)
    monkeypatch.setattr(subprocess, "run", lambda *a, **kw: subprocess.CompletedProcess(
        a[0], world["fsck_rc"], stdout="fsck: clean", stderr="" if not world["fsck_rc"] else "a slab is torn"))
    return world


def _run(tmp_path, **kw):
    lines: list[str] = []
    rc = serve_run.run(str(tmp_path / "w"), conversations=2, turns=2, log=lines.append, **kw)
    return rc, lines, json.loads((tmp_path / "w" / "summary.json").read_text())


def test_the_phases_run_in_order_and_a_sound_run_passes(fake, tmp_path):
    rc, lines, summary = _run(tmp_path)
    assert rc == 0 and summary["failures"] == [] and lines[-1].startswith("OK: every replay")
    assert [p["phase"] for p in summary["phases"]] == [
        "reference, cold (flush before each)", "reference, radix cache warm", "HiCache + L3, first pass",
        "after restart (cold_start=load)", "negative control (reloaded KV perturbed)"]
    assert [s.l3 for s in _FakeServer.started] == [False, True, True, True]  # one reference server, three L3
    assert _FakeServer.started[-1].env == {serve_run.CPU.perturb_env: "1"}
    restart = summary["phases"][3]
    assert (restart["requests"], restart["cached_storage"], restart["l3_spilled_pages"]) == (4, 400, 7)
    assert any("negative control: perturbed reloaded KV changed the ids" in n for n in summary["notes"])


@pytest.mark.parametrize("broken,failure", [
    ("perturb_ignored", "negative control: perturbed reloaded KV gave the same ids"),
    ("no_hits_after_restart", "zero storage (L3) hits after the restart"),
    ("fsck_rc", "l3 fsck exit 1: a slab is torn"),
])
def test_each_failure_fails_the_run(fake, tmp_path, broken, failure):
    fake[broken] = 1 if broken == "fsck_rc" else True
    rc, lines, summary = _run(tmp_path)
    assert rc == 1 and any(f.startswith(failure) for f in summary["failures"])
    assert any(line.startswith("FAIL: " + failure) for line in lines)


def test_extra_phases_run_between_the_restart_and_the_negative_control(fake, tmp_path):
    seen = []

    def extra(l3_phase, compare, reference):
        phase = l3_phase("extra", "an extra L3 phase", args=("--extra",))
        seen.append((compare(phase.replies, reference), _FakeServer.started[-1].args[-1]))
        return ["extra failed"], ["extra note"]

    rc, _, summary = _run(tmp_path, extra_phases=extra)
    assert seen == [([], "--extra")]
    assert [p["phase"] for p in summary["phases"]][-2:] == ["an extra L3 phase",
                                                           "negative control (reloaded KV perturbed)"]
    assert rc == 1 and summary["failures"] == ["extra failed"] and "extra note" in summary["notes"]
