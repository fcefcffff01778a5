"""The served run on a GPU (``sglang-glm-ext gpu-bringup run``): the CPU main job's workload and phases
(``cpu_serve/run.py``) through SGLang's real server on a CUDA GPU with the bring-up tier, pinned HiCache host pools,
SGLang's copy kernels (``--hicache-io-backend kernel``), L3 on the machine's disk, and a phase with decode CUDA
graphs and the plugin's capture attribution. This module holds what differs from the CPU run: SGLang's arguments
and environment, and the CUDA-graph phase with its checks of the ``[cg_mem]`` lines SGLang's real capture logged.

Pure: no SGLang import (the servers are child processes).
"""

from __future__ import annotations

import re
from typing import Any, Callable

from .feature import GPU_BRINGUP, INDEXER_TORCH, PERTURB_LOADS, REQUIRED

# SGLang 0.5.23 on a GPU without sgl-kernel (docs_internal/gpu_bringup.md): dummy weights (the tiny models' seeded
# init, gpu_bringup.dummy_weights), the triton attention backend (GLM-5: dense MLA, its DSA sparse kernels are not
# built for this torch), eager unless a phase asks for graphs. float32 as on the CPU: in bf16 a prefix hit and a cold
# prefill of the same prompt differ in reduction order enough to flip near-tie greedy tokens of a random model.
BASE_ARGS = ("--device", "cuda", "--attention-backend", "triton", "--load-format", "dummy", "--page-size", "64",
             "--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled")
# After BASE_ARGS on the command line (the last value of an option wins): decode graphs for batches of 1-4.
GRAPH_ARGS = ("--cuda-graph-backend-decode", "full", "--cuda-graph-max-bs-decode", "4")
BASE_ENV = {GPU_BRINGUP.name: "1", **{name: value for name, value, _ in REQUIRED}, INDEXER_TORCH[0]: INDEXER_TORCH[1]}


def hicache_args(layout: str, io_backend: str = "kernel") -> tuple:
    return ("--enable-hierarchical-cache", "--hicache-ratio", "2", "--hicache-io-backend", io_backend,
            "--hicache-mem-layout", layout, "--hicache-write-policy", "write_through",
            "--hicache-storage-prefetch-policy", "wait_complete")


def profile(layout: str, *, dtype: str = "float32", io_backend: str = "kernel", max_total_tokens: int = 8192,
            mem_fraction: float = 0.1):
    """The fields of the ``cpu_serve.run.Profile`` of a GPU served run (the caller builds it: features stay apart).
    ``max_total_tokens``: the device KV pool; HiCache's host pool is twice it (``--hicache-ratio 2``).
    ``mem_fraction``: small, so several served runs share one GPU (a tiny model needs little)."""
    return dict(name=f"gpu {layout} {io_backend} {dtype}",
                base_args=(*BASE_ARGS, "--dtype", dtype, "--max-total-tokens", str(max_total_tokens),
                           "--mem-fraction-static", str(mem_fraction)),
                base_env=tuple(BASE_ENV.items()), hicache_args=hicache_args(layout, io_backend),
                perturb_env=PERTURB_LOADS.name, deployment_id=f"gpu-served-{layout}", mla="glm5")


# ---- the CUDA-graph phase's proof from the server log -----------------------------------------------------------
_TOTAL = re.compile(r"\[cg_mem\] (?P<label>[\w.]+): TOTAL static buffers (?P<own>[\d.]+) MiB own.*?"
                    r"(?:graph pool|reserved) \+(?P<pool>[\d.]+) MiB over (?P<n>\d+) shapes.*?"
                    r"whole capture (?P<counter>graph pool|reserved) \+(?P<whole>[\d.]+) MiB")
_SHAPE_HEAD = re.compile(r"\[cg_mem\] (?P<label>[\w.]+): graph memory per captured shape")
_BUFFERS = re.compile(r"\[cg_mem\] (?P<label>[\w.]+): static buffers \((?P<n>\d+)\)")


def cg_mem_report(log_text: str) -> dict[str, Any]:
    """What SGLang's real capture logged through the plugin: per family, its static buffer count, the per-shape
    deltas (MiB) of each counter, the TOTAL line's growth and the whole capture's, on the counter that line names
    (``graph pool`` where the pool was readable at the start of the capture, else ``reserved``, as the plugin of
    before 2026-12-05 logged SGLang 0.5.23's decode capture, whose pool is created inside the call). The check of
    the H200 core run holds when the per-shape deltas of that counter sum to the whole capture's growth: memory is
    taken only while a shape is captured, so every MiB must be in some shape's window."""
    lines = log_text.splitlines()
    out: dict[str, Any] = {}
    for i, ln in enumerate(lines):
        m = _BUFFERS.search(ln)
        if m:
            out.setdefault(m["label"], {})["buffers"] = int(m["n"])
        m = _SHAPE_HEAD.search(ln)
        if m:
            fam = out.setdefault(m["label"], {})
            header = lines[i + 1].split()[1:] if i + 1 < len(lines) else []  # after "shape"
            columns: dict[str, list[float]] = {c: [] for c in header}
            for row in lines[i + 2:]:
                cells = row.split()
                if not cells or "[cg_mem]" in row or not cells[0].startswith("bs="):
                    break
                for c, v in zip(header, cells[1:]):
                    columns[c].append(float(v))
            fam["shape_mib"] = columns
            fam["shape_pool_mib"] = columns.get("pool", [])
            fam["shape_sum_mib"] = round(sum(fam["shape_pool_mib"]), 2)
        m = _TOTAL.search(ln)
        if m:
            fam = out.setdefault(m["label"], {})
            fam.update(own_mib=float(m["own"]), pool_mib=float(m["pool"]), shapes=int(m["n"]),
                       whole_counter="pool" if m["counter"] == "graph pool" else "reserved",
                       whole_mib=float(m["whole"]))
            if fam["whole_counter"] == "pool":
                fam["whole_pool_mib"] = fam["whole_mib"]
    for fam in out.values():
        col = fam.get("shape_mib", {}).get(fam.get("whole_counter", ""))
        if col is not None and "whole_mib" in fam:
            fam["counter_sum_mib"] = round(sum(col), 2)
            fam["sums_to_pool"] = abs(fam["counter_sum_mib"] - fam["whole_mib"]) < 0.01
    return out


def graph_phase(l3_phase: Callable, compare: Callable, reference) -> tuple[list[str], list[str]]:
    """The extra phase ``cpu_serve.run.run`` calls: the L3 server again with decode CUDA graphs (bs 1-4) and
    ``SGLANG_LOG_CG_BUFFERS=1``; the workload; its ids against the eager reference; the ``[cg_mem]`` tables of
    SGLang's real capture, from that server's log. Returns (failures, notes)."""
    phase = l3_phase("cuda graphs", "HiCache + L3 + decode CUDA graphs (bs 1-4)", env={"SGLANG_LOG_CG_BUFFERS": "1"},
                     args=GRAPH_ARGS)
    failures, notes = [], []
    bad = compare(phase.replies, reference)
    if bad:
        failures.append(f"with decode CUDA graphs, requests {bad} differ from the eager reference")
    else:
        notes.append("decode CUDA graphs: every request's ids equal the eager reference (greedy)")
    with open(phase.log_path, errors="replace") as f:
        report = cg_mem_report(f.read())
    phase.note = report
    if not report:
        failures.append("no [cg_mem] table in the CUDA-graph server's log: the attribution did not run")
    for fam, r in report.items():
        counter = r.get("whole_counter", "pool")
        if not r.get("sums_to_pool", False):
            failures.append(f"cg_mem {fam}: per-shape {counter} deltas {r.get('counter_sum_mib')} MiB do not sum to "
                            f"the whole capture's {counter} growth {r.get('whole_mib')} MiB")
        else:
            notes.append(f"cg_mem {fam}: {r.get('buffers')} static buffers, {r.get('own_mib')} MiB own; graph pool "
                         f"+{r.get('pool_mib')} MiB over {r.get('shapes')} shapes; whole capture {counter} "
                         f"+{r['whole_mib']} MiB = the sum of the per-shape {counter} deltas "
                         f"{r['shape_mib'][counter]}")
    return failures, notes
