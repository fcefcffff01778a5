"""`l3 fsck` on a large disk says how far it is: on stderr, only once the run has taken a few seconds (a quick run
prints nothing), redrawn in place on a terminal and wiped at the end, a plain line now and then in a log; never
with --json, whose stdout stays the report alone. Time here is a fake clock: no test waits or measures."""

from __future__ import annotations

import argparse
import hashlib
import io
import json

import numpy as np

from sglang_glm_ext.l3.config import L3Config
from sglang_glm_ext.l3.disk.format import Namespace, PayloadKind, slot_bytes_for
from sglang_glm_ext.l3.engine.store import L3Store
from sglang_glm_ext.l3.tools import fsck as fsck_mod
from sglang_glm_ext.l3.tools.fsck import fsck
from sglang_glm_ext.l3.tools.progress import Progress

PB = 4096 + 50
NS = Namespace("glm5", "bf16", "page_first", 64, 0, 78, "tp0")


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class Term(io.StringIO):
    def isatty(self):
        return True


def test_nothing_before_the_delay_then_a_line_redrawn_in_place_and_wiped_on_a_terminal():
    clock, out = Clock(), Term()
    p = Progress("l3 fsck", out, delay=3.0, every_tty=0.5, clock=clock)
    p.phase("checking index entries", 1000)
    for _ in range(10):
        clock.t += 0.1
        p.advance()
    assert out.getvalue() == ""  # a quick run says nothing
    clock.t = 3.0
    p.advance()
    assert out.getvalue() == "\rl3 fsck: checking index entries 11/1,000 (1%)"
    p.advance(489)
    assert out.getvalue().count("\r") == 1  # at most one redraw per every_tty
    clock.t = 3.5
    p.advance()
    assert out.getvalue().endswith("\rl3 fsck: checking index entries 501/1,000 (50%)") and "\n" not in out.getvalue()
    p.finish()
    assert out.getvalue().endswith("\r" + " " * len("l3 fsck: checking index entries 501/1,000 (50%)") + "\r")


def test_a_log_gets_a_plain_line_now_and_then_and_keeps_it():
    clock, out = Clock(), io.StringIO()
    p = Progress("l3 fsck", out, delay=3.0, every_log=10.0, clock=clock)
    p.phase("scanning slots", 40)
    for t in (1.0, 3.0, 5.0, 12.9, 13.0):
        clock.t = t
        p.advance()
    p.finish()
    assert out.getvalue() == ("l3 fsck: scanning slots 2/40 (5%)\n"
                              "l3 fsck: scanning slots 5/40 (12%)\n")


def test_off_prints_nothing_ever():
    p = Progress.off()
    p.phase("x", 1)
    p.advance(10**6)
    p.finish()  # no stream to write to: nothing to check but that it does not fail


def _store(tmp_path, pages=12):
    cfg_path = tmp_path / "l3.toml"
    cfg_path.write_text(f'deployment_id = "dep"\n[[disks]]\npath = "{tmp_path}/disk0"\n'
                        f'budget = {40 * slot_bytes_for(PB)}\n[index]\npath = "{tmp_path}/index"\nmap_size = "16MiB"\n')
    cfg = L3Config.from_file(cfg_path)
    s = L3Store.open(cfg, rank=0, namespace=NS, page_bytes={PayloadKind.TARGET_KV: PB})
    keys = [hashlib.sha256(f"p{i}".encode()).hexdigest() for i in range(pages)]
    assert all(s.spill(PayloadKind.TARGET_KV, keys, [np.full(PB, i, np.uint8) for i in range(pages)]))
    assert s.flush(30)
    s.close()
    return cfg, str(cfg_path)


def test_fsck_counts_every_entry_then_every_slot(tmp_path):
    cfg, _ = _store(tmp_path)
    out = io.StringIO()
    clock = Clock()
    rep = fsck(cfg, progress=Progress("l3 fsck", out, delay=0.0, every_log=0.0, clock=clock))
    lines = out.getvalue().splitlines()
    assert rep.live == 12 and rep.empty == 28
    assert lines[0] == "l3 fsck: checking index entries 1/12 (8%)"
    assert "l3 fsck: checking index entries 12/12 (100%)" in lines
    assert lines[-1] == "l3 fsck: scanning slots 40/40 (100%)"


class Eager(Progress):
    """fsck's own Progress, but at once and without a terminal (a test cannot wait three seconds)."""

    def __init__(self, label, out=None, **kw):
        super().__init__(label, out, delay=0.0, every_log=0.0)


def test_the_command_puts_progress_on_stderr_and_none_with_json(tmp_path, capsys, monkeypatch):
    _, cfg_path = _store(tmp_path)
    monkeypatch.setattr(fsck_mod, "Progress", Eager)
    assert fsck_mod.run_args(argparse.Namespace(config=cfg_path, repair=False, headers_only=False, json=False)) == 0
    out, err = capsys.readouterr()
    assert "l3 fsck: scanning slots 40/40 (100%)" in err and "scanning slots" not in out
    assert out.rstrip().endswith("result: clean")
    assert fsck_mod.run_args(argparse.Namespace(config=cfg_path, repair=False, headers_only=False, json=True)) == 0
    out, err = capsys.readouterr()
    assert err == "" and json.loads(out)["live"] == 12
