"""`sglang-glm-ext cpu-serve run`: the main job's served run, through SGLang's real HTTP server on this CPU.

1. A tiny GLM-5 (``GlmMoeDsaForCausalLM``, dummy weights) from ``tiny_model.py``.
2. **reference**: the same server without HiCache. A chat workload over HTTP (several multi-turn conversations
   sharing one system prompt, greedy, ``ignore_eos``, SGLang's ``cached_tokens_details`` and output ids), run twice:
   cold (``/flush_cache`` before each request) and with the radix cache warm. Equal ids establish that a device
   prefix hit gives the same greedy ids as a cold run on this CPU; the cold ids are then the reference. If they
   differ, each replay is compared with the first pass of the HiCache server instead, and the run says so.
3. **first pass**: HiCache + ``--enable-cp-l3`` (``cold_start = "load"`` on an empty directory), ``--enable-metrics``;
   the workload; wait until ``sglang:cp_l3_spill_pages_total`` stops rising; stop.
4. **after restart**: the same server again (the config's ``cold_start = "load"``); the same workload replayed.
5. **negative control**: once more with ``SGLANG_GLM_EXT_CPU_SERVE_PERTURB_LOADS=1`` (reloaded KV negated and
   scaled on purpose): the comparison must fail, else it could not see wrong KV.
6. ``sglang-glm-ext l3 fsck`` of the disk.

A table per phase (requests, prompt tokens, cached tokens by tier, L3 pages spilled / reloaded from ``/metrics``,
median TTFT). Exit 1 on any mismatch, zero storage hits after the restart, a negative control that passes, or a
failing fsck. Every server runs in its own process group and is stopped on every exit path (Ctrl-C included).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from . import served, tiny_model

@dataclass(frozen=True)
class Profile:
    """Where the served run runs: SGLang's arguments and environment for every server, the HiCache arguments of the
    L3 servers, the negative control's switch. ``CPU`` here; the GPU bring-up tier builds its own
    (``gpu_bringup/served.py``)."""

    name: str
    base_args: tuple = served.CPU_BASE_ARGS
    base_env: tuple = tuple(served.CPU_SERVE_ENV.items())
    hicache_args: tuple = served.HICACHE_ARGS
    perturb_env: str = "SGLANG_GLM_EXT_CPU_SERVE_PERTURB_LOADS"
    deployment_id: str = "cpu-serve-main-job"
    mla: str = "tiny"  # glm5's MLA head geometry (tiny_model.MLA_GEOMETRY)


CPU = Profile("cpu")
SPILL = "sglang:cp_l3_spill_pages_total"
RELOAD = "sglang:cp_l3_reload_pages_total"
_WORDS = ("cache", "token", "prefix", "layer", "page", "disk", "host", "device", "attention", "expert", "router",
          "batch", "decode", "prefill", "index", "sparse", "dense", "model", "server", "request", "reply", "tier",
          "latent", "rotary", "kernel", "stream", "budget", "spill", "reload", "slab", "checksum", "restart")


def _text(rng: random.Random, chars: int) -> str:
    out: list[str] = []
    n = 0
    while n < chars:
        w = rng.choice(_WORDS)
        out.append(w)
        n += len(w) + 1
    return " ".join(out)


def workload(conversations: int = 3, turns: int = 3, system_chars: int = 900, turn_chars: int = 120,
             seed: int = 0) -> list[list[dict]]:
    """The requests in send order (turn by turn across conversations): each is the message list of one chat turn.
    Assistant turns are scripted text, so every pass sends identical prompts and replies compare per request.
    The tiny model's tokenizer is byte-level: a character is a token."""
    rng = random.Random(seed)
    system = {"role": "system", "content": "You are a careful assistant. " + _text(rng, system_chars)}
    convs = [[system] for _ in range(conversations)]
    reqs = []
    for t in range(turns):
        for c, msgs in enumerate(convs):
            msgs.append({"role": "user", "content": f"[conversation {c} turn {t}] " + _text(rng, turn_chars)})
            reqs.append([dict(m) for m in msgs])
            msgs.append({"role": "assistant", "content": _text(rng, turn_chars)})
    return reqs


@dataclass
class Phase:
    name: str
    replies: list = field(default_factory=list)
    spilled: float = 0.0
    reloaded: float = 0.0
    note: Any = ""
    log_path: str = ""

    def row(self) -> dict:
        r = self.replies
        return {"phase": self.name, "requests": len(r), "prompt_tokens": sum(x.prompt_tokens for x in r),
                "cached_device": sum(x.cached["device"] for x in r), "cached_host": sum(x.cached["host"] for x in r),
                "cached_storage": sum(x.cached["storage"] for x in r), "l3_spilled_pages": int(self.spilled),
                "l3_reloaded_pages": int(self.reloaded),
                "ttft_median_ms": round(1000 * served.median(x.ttft_s for x in r), 1) if r else None,
                "ttft_p90_ms": round(1000 * served.percentile((x.ttft_s for x in r), 0.9), 1) if r else None}


def table(phases: Sequence[Phase]) -> str:
    cols = ("phase", "requests", "prompt_tokens", "cached_device", "cached_host", "cached_storage",
            "l3_spilled_pages", "l3_reloaded_pages", "ttft_median_ms", "ttft_p90_ms")
    head = ("phase", "requests", "prompt tok", "cached device", "cached host", "cached storage", "L3 spilled",
            "L3 reloaded", "TTFT median ms", "TTFT p90 ms")
    rows = [[str(p.row()[c]) for c in cols] for p in phases]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    return "\n".join([line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


def compare(got: Sequence, want: Sequence) -> list[int]:
    """Indices of the requests whose output ids differ."""
    return [i for i, (g, w) in enumerate(zip(got, want, strict=True)) if g.output_ids != w.output_ids]


def _flush(url: str, timeout: float = 30.0) -> None:
    """SGLang's /flush_cache: the device and host tiers (a storage tier keeps its pages). Retried while the scheduler
    still holds a finished request's tail: it refuses a flush then ("Cache not flushed because there are pending
    requests", an HTTP error)."""
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(urllib.request.Request(url + "/flush_cache", b"", method="POST"), timeout=60).read()
            return
        except OSError:  # urllib's HTTPError and URLError are OSErrors
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _l3_config(work: str, deployment_id: str = CPU.deployment_id) -> str:
    path = os.path.join(work, "l3.toml")
    with open(path, "w") as f:
        f.write(f'''deployment_id = "{deployment_id}"
cold_start = "load"
direct_io = "auto"

[[disks]]
path = "{work}/l3/disk0"
budget = "256MiB"

[index]
path = "{work}/l3/index"
map_size = "64MiB"

[queues]
staging_bytes = "32MiB"
''')
    return path


class Runner:
    """Owns the one server alive at a time; ``close`` (also on SIGINT / SIGTERM) stops its process group."""

    def __init__(self, work: str, model: str, log, timeout: float, profile: Profile = CPU):
        self.work, self.model, self.log, self.timeout, self.profile = work, model, log, timeout, profile
        self.server: served.Server | None = None
        self.n = 0

    def start(self, name: str, args: Sequence[str], env: dict | None = None) -> served.Server:
        """One server with the profile's arguments, then ``args`` (where an option repeats, the last wins)."""
        self.n += 1
        log_path = os.path.join(self.work, f"server{self.n}_{name.replace(' ', '_')}.log")
        self.log(f"[{name}] starting SGLang's server (log {log_path})")
        self.server = served.Server(self.model, log_path, args=args, env=env or {}, base_args=self.profile.base_args,
                                    base_env=dict(self.profile.base_env))
        took = self.server.start_ready(self.timeout, progress=self.log)
        self.log(f"[{name}] ready in {took:.0f} s on {self.server.url}")
        return self.server

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    close = stop


@dataclass
class _Run:
    """One served run across its phases: the one server alive at a time (``runner``), the workload, and what each
    phase appends to (``phases``, ``failures``, ``notes``)."""

    runner: Runner
    reqs: list
    cfg_path: str
    profile: Profile
    phases: list = field(default_factory=list)
    failures: list = field(default_factory=list)
    notes: list = field(default_factory=list)

    def reference(self) -> "tuple[list, bool]":
        """No HiCache: the workload cold (flush before each request), then with the radix cache warm. (The cold
        replies, whether a device-cache prefix hit gives their ids: then they are the reference.)"""
        srv = self.runner.start("reference", ())
        cold = Phase("reference, cold (flush before each)")
        for m in self.reqs:
            _flush(srv.url)
            cold.replies.append(served.chat(srv.url, m))
        warm = Phase("reference, radix cache warm")
        _flush(srv.url)
        for m in self.reqs:
            warm.replies.append(served.chat(srv.url, m))
        self.runner.stop()
        self.phases += [cold, warm]
        hit_eq_cold = not compare(warm.replies, cold.replies) and any(r.cached["device"] for r in warm.replies)
        if hit_eq_cold:
            self.notes.append(f"a device-cache prefix hit gives the same greedy ids as a cold run "
                              f"({self.profile.name}) ({sum(r.cached['device'] for r in warm.replies)} device-cached "
                              "tokens): replays are compared with the no-HiCache server's cold ids")
        else:
            self.notes.append("a device-cache prefix hit does NOT give the same greedy ids as a cold run "
                              f"({self.profile.name}) "
                              f"(requests {compare(warm.replies, cold.replies)} differ): each replay is compared "
                              "with the first pass of the HiCache server instead")
        return cold.replies, hit_eq_cold

    def l3_phase(self, name: str, title: str, env: dict | None = None, args: Sequence[str] = ()) -> Phase:
        """One server with HiCache + L3 (and ``args``): the workload, wait for the write-back to drain, stop."""
        l3_args = (*self.profile.hicache_args, "--enable-metrics", "--enable-cp-l3", "--cp-l3-config", self.cfg_path)
        srv = self.runner.start(name, (*l3_args, *args), env=env)
        phase = Phase(title, log_path=srv.log_path)
        for m in self.reqs:
            phase.replies.append(served.chat(srv.url, m))
        phase.spilled = served.wait_counter_settled(srv.url, SPILL)
        phase.reloaded = served.scrape(srv.url).get(RELOAD, 0.0)
        self.runner.stop()
        self.phases.append(phase)
        return phase

    def first_and_restart(self, cold: list, hit_eq_cold: bool) -> list:
        """The first pass with HiCache + L3, then a restart (``cold_start = "load"``) replaying the workload, which
        must match the reference with storage hits. Returns the reference the replays are compared with."""
        first = self.l3_phase("first pass", "HiCache + L3, first pass")
        reference = cold if hit_eq_cold else first.replies
        if hit_eq_cold and compare(first.replies, cold):
            self.failures.append(f"first pass differs from the reference at requests {compare(first.replies, cold)}")
        again = self.l3_phase("after restart", "after restart (cold_start=load)")
        bad = compare(again.replies, reference)
        if bad:
            self.failures.append(f"after the restart, requests {bad} differ from the reference")
        if sum(r.cached["storage"] for r in again.replies) == 0:
            self.failures.append("zero storage (L3) hits after the restart")
        return reference

    def negative_control(self, reference: list) -> None:
        """The reloaded KV perturbed on purpose must make the comparison fail."""
        control = self.l3_phase("negative control", "negative control (reloaded KV perturbed)",
                                env={self.profile.perturb_env: "1"})
        caught = compare(control.replies, reference)
        if not any(r.cached["storage"] for r in control.replies):
            self.failures.append("negative control: no storage hit, so it tested nothing")
        elif not caught:
            self.failures.append("negative control: perturbed reloaded KV gave the same ids (the comparison cannot "
                                 "see wrong KV)")
        else:
            self.notes.append(f"negative control: perturbed reloaded KV changed the ids of requests {caught} (the "
                              "comparison fails as it must)")

    def report(self, work: str, arch: str, t_all: float, log) -> None:
        """The table, the notes, ``l3 fsck`` of what the runs left, ``summary.json`` and the verdict lines."""
        log("")
        log(table(self.phases))
        for n in self.notes:
            log("note: " + n)
        fsck = subprocess.run([sys.executable, "-m", "sglang_glm_ext.cli", "l3", "fsck", self.cfg_path],
                              capture_output=True, text=True, timeout=300)
        log(f"l3 fsck: {fsck.stdout.strip()} (exit {fsck.returncode})")
        if fsck.returncode != 0:
            self.failures.append(f"l3 fsck exit {fsck.returncode}: {fsck.stderr.strip()[-500:]}")
        phases = self.phases
        summary = {"profile": self.profile.name, "arch": arch, "phases": [p.row() for p in phases],
                   "notes": self.notes, "failures": self.failures,
                   "outputs": {p.name: [r.output_ids for r in p.replies] for p in phases},
                   "cached": {p.name: [r.cached for r in p.replies] for p in phases},
                   "phase_notes": {p.name: p.note for p in phases if p.note},
                   "seconds": round(time.monotonic() - t_all, 1)}
        with open(os.path.join(work, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
        log(f"served run: {summary['seconds']} s; summary {os.path.join(work, 'summary.json')}")
        for msg in self.failures:
            log("FAIL: " + msg)
        if not self.failures:
            log("OK: every replay after the restart matches the reference, with L3 hits; the negative control fails")


def run(work: str, *, conversations: int = 3, turns: int = 3, server_timeout: float = 420.0, log=print,
        profile: Profile = CPU, arch: str = "glm5", extra_phases=None) -> int:
    """The served run (module docstring) under ``profile``, for the tiny ``arch``. ``extra_phases(l3_phase,
    compare, reference) -> (failures, notes)`` runs more L3 servers before the negative control (the GPU run's
    CUDA-graph phase); ``l3_phase(name, title, env=, args=)`` runs one and returns its Phase."""
    t_all = time.monotonic()
    os.makedirs(work, exist_ok=True)
    model = os.path.join(work, f"model-{arch}" if arch != "glm5" else "model")
    if not os.path.isfile(os.path.join(model, "config.json")):
        tiny_model.write(arch, model, mla=profile.mla)
    cfg_path = _l3_config(work, profile.deployment_id)
    runner = Runner(work, model, log, server_timeout, profile)
    state = _Run(runner, workload(conversations, turns), cfg_path, profile)

    def on_signal(signum, _frame):
        runner.close()
        raise SystemExit(128 + signum)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        reference = state.first_and_restart(*state.reference())
        if extra_phases is not None:
            more_failures, more_notes = extra_phases(state.l3_phase, compare, reference)
            state.failures += more_failures
            state.notes += more_notes
        state.negative_control(reference)
    finally:
        runner.close()
        for s, h in old.items():
            signal.signal(s, h)
    state.report(work, arch, t_all, log)
    return 1 if state.failures else 0


def add_subcommand(sub) -> None:
    p = sub.add_parser("cpu-serve", help="SGLang's real server on this CPU with the plugin (the main job's run)")
    inner = p.add_subparsers(dest="cpu_serve_command", required=True)
    r = inner.add_parser("run", help="serve a tiny GLM-5 with HiCache + L3, restart, replay, compare, fsck")
    r.add_argument("--dir", required=True, help="work directory (model, L3 config and disk, server logs)")
    r.add_argument("--conversations", type=int, default=3,
                   help="multi-turn conversations in the workload (they share one system prompt)")
    r.add_argument("--turns", type=int, default=3, help="user turns per conversation")
    r.add_argument("--server-timeout", type=float, default=420.0, help="seconds a server may take to be ready")
    r.set_defaults(func=lambda a: run(a.dir, conversations=a.conversations, turns=a.turns,
                                      server_timeout=a.server_timeout, log=lambda s: print(s, flush=True)))
