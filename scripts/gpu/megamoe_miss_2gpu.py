"""The MegaMoE miss path's collectives and gathered MoE on N ranks, torch alone (no SGLang): NCCL on GPUs, gloo on
a CPU. The code under test is the plugin's pure module `sglang_glm_ext.megamoe.miss` (ep_sizes, gatherv,
reduce_scatterv, gathered_moe), the same code SGLang's GLM blocks call on a miss.

Run on a node with 2 GPUs (issue 29; the torch on the box is enough, no SGLang needed):
    PYTHONPATH=. python3 scripts/gpu/megamoe_miss_2gpu.py --world 2 --backend nccl --device cuda
On a CPU (tests/megamoe/test_miss_collectives.py runs it this way, 2-4 ranks):
    PYTHONPATH=. python3 scripts/gpu/megamoe_miss_2gpu.py --world 3 --backend gloo --device cpu

Each rank checks, against a single-process reference computed from the same seeds on the whole batch:
- gatherv / reduce_scatterv with uneven counts, idle ranks and all-equal counts (the two collective forms);
- gathered_moe: a bf16 MoE whose experts are split over the ranks (GLM-like: top-k routing, routed scaling, a
  replicated shared expert), batches of uneven sizes with idle ranks: each rank's rows == the reference's rows;
- the bytes each rank sends for one miss (miss.comm_bytes) against the tensors it actually passed.
`--hang-check`: rank 1 skips a collective; the run must end in the process group's timeout, not hang.
Prints one PASS / FAIL line per check per rank and a RESULT line from rank 0; exit status 1 on any FAIL.
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import sys
import time
import traceback

import torch
import torch.distributed as dist

from sglang_glm_ext.megamoe import miss

E, H, I, TOPK = 12, 256, 128, 2  # 12 experts split evenly over 2, 3 or 4 ranks
RSF = 2.5


def experts_weights(device):
    g = torch.Generator().manual_seed(7)
    w13 = torch.randn(E, 2 * I, H, generator=g) * 0.05
    w2 = torch.randn(E, H, I, generator=g) * 0.05
    shared = (torch.randn(2 * I, H, generator=g) * 0.05, torch.randn(H, I, generator=g) * 0.05)
    return w13.to(device), w2.to(device), tuple(t.to(device) for t in shared)


def moe(x, ids, weights, w13, w2, experts):
    """sum_k RSF * w[t,k] * down_e(silu(gate_e x) * up_e x) over the given experts (global ids)."""
    out = torch.zeros(x.shape[0], H, dtype=torch.float32, device=x.device)
    for e in experts:
        rows, cols = torch.nonzero(ids == e, as_tuple=True)
        if rows.numel() == 0:
            continue
        h = x[rows].float() @ w13[e].t()
        act = torch.nn.functional.silu(h[:, :I]) * h[:, I:]
        out.index_add_(0, rows, (act @ w2[e].t()) * (RSF * weights[rows, cols].float()).unsqueeze(-1))
    return out


def shared_mlp(x, shared):
    gu = x.float() @ shared[0].t()
    return (torch.nn.functional.silu(gu[:, :I]) * gu[:, I:]) @ shared[1].t()


def batch(name, sizes, device):
    """Every rank's rows and routing for one batch, the same on every rank (seeded by the batch name)."""
    g = torch.Generator().manual_seed(sum(map(ord, name)))
    xs = [torch.randn(n, H, generator=g) for n in sizes]
    scores = [torch.rand(n, E, generator=g) for n in sizes]
    ids = [s.topk(TOPK, dim=-1).indices.to(torch.int32) for s in scores]
    wts = [torch.rand(n, TOPK, generator=g) for n in sizes]
    return ([t.to(device) for t in xs], [t.to(device) for t in ids], [t.to(device) for t in wts])


def run(rank, world, backend, device_kind, port, hang_check, out, pg_timeout=30.0):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if device_kind == "cuda":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=pg_timeout),
                            **({"device_id": device} if device_kind == "cuda" else {}))
    group = dist.group.WORLD
    results = []

    def check(name, fn):
        t0 = time.perf_counter()
        try:
            detail = fn() or ""
            status = "PASS"
        except Exception as exc:
            status, detail = "FAIL", f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
        results.append(status)
        print(f"[rank {rank}] {status} {name} ({time.perf_counter() - t0:.2f}s) {detail}", flush=True)

    if hang_check:
        sizes = [3] * world
        try:
            if rank != 1:
                miss.gatherv(torch.ones(3, H, device=device), sizes, group)  # rank 1 never joins
            else:
                time.sleep(45)
            print(f"[rank {rank}] NO-TIMEOUT", flush=True)
        except Exception as exc:
            print(f"[rank {rank}] TIMEOUT {type(exc).__name__}: {str(exc)[:120]}", flush=True)
        os._exit(3)

    def collectives():
        for label, sizes in (("uneven+idle", [5, 0, 17, 2][:world]), ("even", [4] * world), ("all idle", [0] * world),
                             ("one busy", [0] * (world - 1) + [9])):
            assert miss.ep_sizes(sizes[rank], group, device) == sizes
            rows = [torch.arange(n * H, dtype=torch.float32, device=device).reshape(n, H) + 1000 * r
                    for r, n in enumerate(sizes)]
            got = miss.gatherv(rows[rank], sizes, group)
            assert torch.equal(got, torch.cat(rows)), label
            ids = miss.gatherv(torch.full((sizes[rank], TOPK), rank, dtype=torch.int32, device=device), sizes, group)
            assert ids.tolist() == [[r, r] for r, n in enumerate(sizes) for _ in range(n)], label
            partial = torch.cat([torch.full((n, H), float(rank + 1), device=device) * (r + 1)
                                 for r, n in enumerate(sizes)]).to(torch.bfloat16)
            mine = miss.reduce_scatterv(partial, sizes, group)
            want = torch.full((sizes[rank], H), float(sum(range(1, world + 1)) * (rank + 1)), device=device)
            assert mine.dtype == torch.bfloat16 and torch.equal(mine.float(), want), label
        return "uneven, idle, even, one busy"

    w13, w2, shared = experts_weights(device)
    local = E // world

    def gathered():
        errs = []
        for name, sizes in (("uneven", [7, 0, 30, 3][:world]), ("one above the rest", [1] * (world - 1) + [40]),
                            ("even", [12] * world)):
            xs, ids, wts = batch(name, sizes, device)
            ref_all = moe(torch.cat(xs), torch.cat(ids), torch.cat(wts), w13, w2, range(E)) + shared_mlp(
                torch.cat(xs), shared)
            start = sum(sizes[:rank])
            ref = ref_all[start:start + sizes[rank]]
            x = xs[rank].to(torch.bfloat16)
            mine = range(rank * local, (rank + 1) * local)
            y = miss.gathered_moe(x, ids[rank], wts[rank], group=group,
                                  local_experts=lambda gx, gi, gw: moe(gx, gi, gw, w13, w2, mine).to(gx.dtype),
                                  shared=lambda: shared_mlp(x, shared).to(x.dtype))
            assert y.shape == (sizes[rank], H), (y.shape, sizes)
            if sizes[rank]:
                e = float((y.float() - ref).norm() / ref.norm())
                assert e < 2e-2, (name, e)
                errs.append(f"{name} {e:.1e}")
        return "rel err " + ", ".join(errs)

    def comm():
        plan = miss.MissPlan((5, 0, 17, 2)[:world] if world <= 4 else tuple([3] * world), rank)
        sent = plan.rows * (world - 1) * (H * 2 + TOPK * 8) + (plan.total - plan.rows) * H * 2
        assert miss.comm_bytes(plan, H, TOPK) == sent
        return f"{sent} B sent for one miss of one layer (H {H}, bf16)"

    check("collectives: ep_sizes, gatherv, reduce_scatterv", collectives)
    check("gathered_moe == whole-batch reference (experts split over the ranks, shared expert replicated)",
          gathered)
    check("comm_bytes", comm)
    torch.save(results, os.path.join(out, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--backend", default="nccl")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--hang-check", action="store_true")
    ap.add_argument("--out", default="/tmp/megamoe_miss_2gpu")
    ap.add_argument("--pg-timeout", type=float, default=30.0,
                    help="seconds a collective may wait (the process group's timeout; --hang-check ends there)")
    args = ap.parse_args()
    assert E % args.world == 0, f"{E} experts do not split over {args.world} ranks"
    if args.device == "cuda":
        assert torch.cuda.device_count() >= args.world, f"needs {args.world} GPUs, has {torch.cuda.device_count()}"
    os.makedirs(args.out, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    print(f"torch {torch.__version__}, {args.world} ranks, {args.backend} on {args.device}", flush=True)
    torch.multiprocessing.spawn(run, args=(args.world, args.backend, args.device, port, args.hang_check, args.out,
                                      args.pg_timeout),
                                nprocs=args.world, join=True)
    statuses = [s for r in range(args.world) for s in torch.load(os.path.join(args.out, f"rank{r}.pt"))]
    n_fail = statuses.count("FAIL")
    print(f"RESULT: {statuses.count('PASS')} PASS, {n_fail} FAIL ({args.world} ranks)", flush=True)
    sys.exit(1 if n_fail else 0)


if __name__ == "__main__":
    main()
