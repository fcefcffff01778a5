"""GPU proof of the cg_mem core (torch only, no SGLang): real CUDA graphs, one shared graph pool, three families.

Mimics what SGLang's decode-graph runners do at capture: each family owns static buffers, coalesced by name and
size through a process-wide share pool (like share_input_buffer), and captures its shapes largest first into
one global graph pool. Every capture goes THROUGH sglang_glm_ext.cuda_graph_mem.attribution: buffer tables, aliasing,
per-shape deltas from the real allocator (device counters and the graph pool's own segments), family totals.
Each graph is replayed once and checked against eager, so the captures are real.

Run: cd /work/main && PYTHONPATH=. python3 benchmark/cg_mem_h200.py
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import torch

from sglang_glm_ext.cuda_graph_mem import attribution as attr

HIDDEN, INTER, VOCAB = 4096, 14336, 32768
DT = torch.bfloat16
DEV = torch.device("cuda", 0)
_SHARE: dict = {}


def share(name: str, t: torch.Tensor) -> torch.Tensor:
    """Same contract as SGLang's share_input_buffer: same (name, numel, dtype, device) -> one allocation."""
    key = (name, t.numel(), t.dtype, t.device)
    canonical = _SHARE.setdefault(key, t)
    return canonical.as_strided(t.size(), t.stride())


@dataclass
class Bufs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    hidden_states: torch.Tensor
    logits_out: torch.Tensor  # static output buffer, like next_token_logits_buffer


def make_bufs(max_tokens: int, max_bs: int, prefix: str = "") -> Bufs:
    b = Bufs(
        input_ids=torch.zeros(max_tokens, dtype=torch.int64, device=DEV),
        positions=torch.zeros(max_tokens, dtype=torch.int64, device=DEV),
        seq_lens=torch.ones(max_bs, dtype=torch.int32, device=DEV),
        hidden_states=torch.zeros(max_tokens, HIDDEN, dtype=DT, device=DEV),
        logits_out=torch.zeros(max_tokens, VOCAB, dtype=DT, device=DEV),
    )
    for f in ("input_ids", "positions", "seq_lens", "hidden_states"):
        setattr(b, f, share(prefix + f, getattr(b, f)))  # logits_out stays per family, as in SGLang
    return b


class Model:
    def __init__(self):
        g = torch.Generator(device=DEV).manual_seed(0)
        s = 0.02
        self.embed = torch.randn(VOCAB, HIDDEN, generator=g, device=DEV, dtype=DT) * s
        self.up = torch.randn(HIDDEN, INTER, generator=g, device=DEV, dtype=DT) * s
        self.down = torch.randn(INTER, HIDDEN, generator=g, device=DEV, dtype=DT) * s
        self.head = torch.randn(HIDDEN, VOCAB, generator=g, device=DEV, dtype=DT) * s

    def step(self, b: Bufs, n: int) -> torch.Tensor:
        x = self.embed[b.input_ids[:n]] + b.hidden_states[:n]
        x = x + torch.nn.functional.silu(x @ self.up) @ self.down  # activations land in the graph pool
        b.logits_out[:n].copy_(x @ self.head)
        return x  # a per-shape graph output that stays live in the pool


def capture_family(label, bufs, model, shapes, tokens_per_req, pool, graphs):
    rows = ALIASES.check_and_register(label, attr.buffer_rows(bufs))
    print(attr.format_buffer_table(label, rows))
    rec = attr.PoolDeltaRecorder(attr.cuda_stats_fn(DEV, pool_id=pool))
    before = rec.read()
    for bs in sorted(shapes, reverse=True):  # largest first, as SGLang does, so smaller shapes reuse the pool
        n = bs * tokens_per_req
        with rec.shape(attr.shape_label(bs)):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                model.step(bufs, n)  # warm-up outside the graph
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                out = model.step(bufs, n)
        graphs.append((label, bs, n, g, out, bufs))
    torch.cuda.synchronize()
    report = attr.FamilyReport(label, rows, rec, attr.diff(before, rec.read()))
    print(report.format())
    print()
    return report


ALIASES = attr.AliasRegistry()


def main() -> int:
    assert torch.cuda.is_available(), "needs a CUDA GPU"
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}, python {sys.version.split()[0]}")
    model = Model()
    pool = torch.cuda.graph_pool_handle()
    print(f"graph pool handle: {pool!r}")
    base_reserved = torch.cuda.memory_reserved(DEV)
    graphs: list = []
    t0 = time.time()

    # target verify: 4 tokens per request, 256 requests max.
    tv = make_bufs(256 * 4, 256)
    # draft: 1 token per request, so input_ids/positions/hidden_states differ in size from verify's and get
    # their own memory; seq_lens [256] has verify's size and is aliased onto it.
    dr = make_bufs(256 * 1, 256)
    # draft extend: verify's sizes, so every shared field aliases onto target_verify.
    de = make_bufs(256 * 4, 256)

    reports = [
        capture_family("target_verify", tv, model, [1, 8, 32, 64, 128, 256], 4, pool, graphs),
        capture_family("draft", dr, model, [1, 8, 32, 64, 128, 256], 1, pool, graphs),
        capture_family("draft_extend", de, model, [1, 8, 32, 64, 128, 256], 4, pool, graphs),
    ]
    capture_s = time.time() - t0

    # The captures are real: replay each and compare with eager on fresh inputs.
    worst = 0.0
    for label, bs, n, g, out, bufs in graphs:
        bufs.input_ids[:n].random_(0, VOCAB)
        bufs.hidden_states[:n].normal_()
        g.replay()
        ref = model.step(bufs, n)
        worst = max(worst, (out - ref).abs().max().item())
    torch.cuda.synchronize()

    pool_reserved, pool_live = attr.graph_pool_bytes(pool, DEV)
    summed = sum(r.recorder.totals().get("pool", 0) for r in reports)
    print("== summary ==")
    for r in reports:
        print(r.total_line())
    print(f"graph pool segments now: {pool_reserved / attr.MIB:.2f} MiB reserved, {pool_live / attr.MIB:.2f} MiB live;"
          f" sum of per-shape pool deltas: {summed / attr.MIB:.2f} MiB")
    print(f"device reserved grew {(torch.cuda.memory_reserved(DEV) - base_reserved) / attr.MIB:.2f} MiB since the"
          f" graph pool was made (static buffers and warm-up included)")
    print(f"{len(graphs)} graphs captured in {capture_s:.2f}s; replay vs eager max |diff| = {worst:.3e}")
    seen_ids = {tuple(s.get('segment_pool_id', ())) for s in torch.cuda.memory_snapshot()}
    print(f"segment_pool_ids seen: {sorted(seen_ids)}")
    ok = summed == pool_reserved and pool_reserved > 0 and worst < 1e-2
    print("CHECK", "OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
