"""SM90 `fp8_mega_moe` with expert parallelism over N GPUs (issue 29, item 2), torch alone: no SGLang on the box.

One process per GPU (spawn), an NCCL group of N ranks, DeepGEMM's SM90 MegaMoE symmetric buffer over it (torch
symmetric memory). Every rank builds the same global GLM-shaped layer (16 experts, H 512, I 256, top-8 of 4 groups)
and hands the kernel its own contiguous slice of experts (rank r: experts [r * 16/N, (r + 1) * 16/N), global ids in
top-k, as DeepGEMM's SM90 API asks), fed exactly as SGLang 0.5.23's `run_sm90_mega_routed` feeds it
(layers/moe/mega_moe_sm90.py:56-84) from the plugin's plan (glm4.plan_block at moe_ep_size = N, glm4.runner_kwargs,
routing.kernel_routing, sm90_fp8.interleave_gate_up). Checks, per rank:
- sharding: the ranks' local-expert references (sm90_fp8.reference_moe with expert_offset) sum, over the group, to the
  whole layer's reference: the slices are the layer (this one runs on a CPU too, over gloo);
- kernel: each rank's output rows == the dequantised reference of its own tokens over all 16 experts (FP8
  activations modelled), for uneven token counts, one idle rank, equal counts; a reading of the interleaved rows as
  [gate; up] is far off (the control);
- weight update: experts 1, 5, 9 (gate and up) and 3 (gate only) rewritten through the plugin's loader hook
  (weight_update.hook_weight_loader_impl around FusedMoE._load_w13's in-place write, local expert ids) on the rank
  that owns each: every rank's output == the updated reference; 0.5.23's write without the relayout is far off.
A rank that fails or waits on a collective the others skipped ends in the process group's timeout; the parent kills
the group at --deadline and reports FAIL: nothing waits forever.

Run on a node with 2 GPUs (repo root; /tmp/dg: the sgl-deep-gemm 0.1.5.post1 and apache-tvm-ffi 0.1.11 wheels
unpacked, as for megamoe_h200.py):
    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
        PYTHONPATH=.:/tmp/dg python3 scripts/gpu/megamoe_ep.py --world 2
(the three multicast switches are also set here, for the spawned ranks, when absent). `--world 1` on one GPU runs
the same code at ep = 1; `--backend gloo --device cpu --world 2` is the CPU smoke run (kernel checks SKIP) that
tests/megamoe/test_gpu_script.py keeps runnable. Prints PASS / FAIL / SKIP per check with every rank's detail and a
RESULT line; exit status 1 on any FAIL.
"""

from __future__ import annotations

import argparse
import datetime
import os
import queue as queue_mod
import socket
import sys
import time
import traceback
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from sglang_glm_ext.megamoe import glm4, routing, sm90_fp8, weight_update

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from megamoe_kit import Skip, deep_gemm_or_skip, glm_layer, mega_kernel, rel, sglang_load_w13  # noqa: E402

E, H, I, TOPK, GROUPS, TOPK_GROUP, RSF, CAP = 16, 512, 256, 8, 4, 2, 2.5, 256
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
UPDATED = {1: ("w1", "w3"), 5: ("w1", "w3"), 9: ("w1", "w3"), 3: ("w1",)}  # expert 3: gate rows only


def weights(seed):
    return glm_layer(E, H, I, seed)


def token_counts(case, world):
    """Tokens per rank for one case (the same list on every rank)."""
    if case == "uneven":
        return [(96, 40, 17, 5)[r % 4] for r in range(world)]
    if case == "idle":  # the last rank has no tokens and still enters every collective
        return [64] * (world - 1) + [0]
    return [128] * world


def batch(case, rank, tokens):
    """This rank's tokens and routing for one case: bf16 rows, GLM grouped top-k over the global experts."""
    g = torch.Generator().manual_seed(1000 * (("uneven", "idle", "equal", "update").index(case) + 1) + rank)
    x = torch.randn(tokens, H, generator=g).to(torch.bfloat16)
    w, ids = routing.glm_grouped_topk(torch.randn(tokens, E, generator=g), torch.randn(E, generator=g) * 0.1,
                                      top_k=TOPK, num_expert_group=GROUPS, topk_group=TOPK_GROUP, renormalize=True)
    return x, w, ids


def worker(rank, world, port, backend, device, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dev = torch.device(f"cuda:{rank}") if device == "cuda" else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    kw_init = {"device_id": dev} if backend == "nccl" else {}
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120),
                            **kw_init)
    local = E // world
    lo, hi = rank * local, (rank + 1) * local
    state = {}

    def run(name, fn):
        t0 = time.perf_counter()
        try:
            status, detail = "PASS", fn() or ""
        except Skip as exc:
            status, detail = "SKIP", str(exc)
        except Exception as exc:
            status, detail = "FAIL", f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
        results.put((rank, name, status, f"{detail} ({time.perf_counter() - t0:.2f}s)"))

    def sharding():
        w13, s13, w2, s2 = weights(3)
        x, w, ids = batch("uneven", 0, 96)  # the same tokens on every rank
        full = sm90_fp8.reference_moe(x.float(), ids, w, w13, s13, w2, s2, routed_scaling_factor=RSF,
                                      w13_interleaved=False)
        part = sm90_fp8.reference_moe(x.float(), ids, w, w13[lo:hi], s13[lo:hi], w2[lo:hi], s2[lo:hi],
                                      routed_scaling_factor=RSF, w13_interleaved=False, expert_offset=lo).to(dev)
        dist.all_reduce(part)
        e = rel(part, full)
        assert e < 1e-5, e
        return f"experts [{lo}, {hi}) of {E}; sum over {world} ranks vs whole layer rel err {e:.1e}"

    def setup():
        dg = deep_gemm_or_skip(dev)
        block = SimpleNamespace(
            config=SimpleNamespace(num_experts_per_tok=TOPK, moe_intermediate_size=I, hidden_size=H,
                                   n_shared_experts=None, routed_scaling_factor=RSF),
            experts=SimpleNamespace(num_experts=E, intermediate_size_per_partition=I,
                                    moe_runner_config=SimpleNamespace(swiglu_limit=None)),
            layer_id=0, num_fused_shared_experts=0, shared_experts=None, tp_size=world)
        plan = glm4.plan_block(block, scale_fused_in_topk=False, moe_ep_size=world, name=f"ep{world}")
        buf = dg.get_symm_buffer_for_sm90_mega_moe(dist.group.WORLD, plan.num_experts, CAP, plan.top_k,
                                                   plan.hidden_size, plan.intermediate_size)
        state.update(dg=dg, plan=plan, buf=buf)
        return (f"deep_gemm {getattr(dg, '__version__', '?')}, {plan.num_experts} experts, {local} local, "
                f"buffer x {tuple(buf.x.shape)}")

    def call(x, w, ids, l1, l2):
        dg, plan, buf = state["dg"], state["plan"], state["buf"]
        kr = routing.kernel_routing(ids.to(dev), w.to(dev), num_tokens=x.shape[0], top_k=plan.top_k,
                                    num_experts=plan.num_experts, routed_scaling_factor=plan.routed_scaling_factor,
                                    scale_fused_in_topk=plan.scale_fused_in_topk, check_ids=True, device=dev)
        y = mega_kernel(dg, buf, l1, l2, x.to(dev), kr, glm4.runner_kwargs(plan, kr))
        torch.cuda.synchronize(dev)
        return y

    def kernel():
        if "buf" not in state:
            raise Skip("no symmetric buffer (previous check)")
        w13, s13, w2, s2 = weights(3)
        l1 = (sm90_fp8.interleave_gate_up(w13[lo:hi].to(dev)).contiguous(), s13[lo:hi].to(dev).contiguous())
        l2 = (w2[lo:hi].to(dev).contiguous(), s2[lo:hi].to(dev).contiguous())
        # Every rank makes every kernel call before any assertion: the kernel is collective, so a rank that stopped
        # at its first wrong case would leave the others spinning in the next call.
        outputs = {}
        for case in ("uneven", "idle", "equal"):
            tokens = token_counts(case, world)[rank]
            x, w, ids = batch(case, rank, tokens)
            outputs[case] = (tokens, x, w, ids, call(x, w, ids, l1, l2).cpu())
        out, bad = [], []
        for case, (tokens, x, w, ids, y) in outputs.items():
            ref_q = sm90_fp8.reference_moe(x.float(), ids, w, w13, s13, w2, s2, routed_scaling_factor=RSF,
                                           w13_interleaved=False, quantize_activations=True)
            e_q = rel(y, ref_q)
            wrong = rel(y, sm90_fp8.reference_moe(x.float(), ids, w, sm90_fp8.interleave_gate_up(w13), s13, w2, s2,
                                                  routed_scaling_factor=RSF, w13_interleaved=False))
            if tuple(y.shape) != (tokens, H) or e_q >= 0.05 or (tokens and wrong <= 0.2):
                bad.append((case, tokens, tuple(y.shape), e_q, wrong))
            out.append(f"{case} {tokens} tok: rel err {e_q:.2e}" + (f" (stock reading {wrong:.2f})" if tokens else ""))
        assert not bad, bad
        return "; ".join(out)

    def update():
        if "buf" not in state:
            raise Skip("no symmetric buffer (previous check)")
        w13, s13, w2, s2 = weights(3)
        new13 = weights(4)[0]
        param = SimpleNamespace(data=sm90_fp8.interleave_gate_up(w13[lo:hi].to(dev)).contiguous())
        l1 = (param.data, s13[lo:hi].to(dev).contiguous())
        l2 = (w2[lo:hi].to(dev).contiguous(), s2[lo:hi].to(dev).contiguous())
        layer = SimpleNamespace(_mega_moe_weights_built=True, _mega_moe_sm90_fp8_weights=True, w13_weight=param)
        stock = param.data.clone()
        want = w13.clone()
        mine = []
        for e, shards in UPDATED.items():
            for shard in shards:
                half = slice(0, I) if shard == "w1" else slice(I, 2 * I)
                want[e][half] = new13[e][half]
                if lo <= e < hi:  # the owning rank's loader gets the local expert id, as FusedMoE maps it
                    weight_update.hook_weight_loader_impl(sglang_load_w13, layer, param, new13[e][half].to(dev),
                                                          f"experts.{e}.{shard}.weight", shard, e - lo)
                    sglang_load_w13(None, SimpleNamespace(data=stock), new13[e][half].to(dev), "", shard, e - lo)
                    mine.append(e)
        tokens = token_counts("uneven", world)[rank]
        x, w, ids = batch("update", rank, tokens)
        y = call(x, w, ids, l1, l2)  # both collective calls first (see kernel()), then the assertions
        y_stock = call(x, w, ids, (stock, l1[1]), l2)
        assert param.data.data_ptr() == l1[0].data_ptr()
        assert torch.equal(param.data.view(torch.uint8).cpu(),
                           sm90_fp8.interleave_gate_up(want[lo:hi]).view(torch.uint8))
        ref_q = sm90_fp8.reference_moe(x.float(), ids, w, want, s13, w2, s2, routed_scaling_factor=RSF,
                                       w13_interleaved=False, quantize_activations=True)
        e_new = rel(y, ref_q)
        e_old = rel(y, sm90_fp8.reference_moe(x.float(), ids, w, w13, s13, w2, s2, routed_scaling_factor=RSF,
                                              w13_interleaved=False, quantize_activations=True))
        e_stock = rel(y_stock, ref_q)
        assert e_new < 0.05 and e_old > 0.05 and e_stock > 0.05, (e_new, e_old, e_stock)
        return (f"{tokens} tok, experts written here {sorted(set(mine))}: rel err vs updated {e_new:.2e} (old "
                f"weights {e_old:.2f}; 0.5.23's write without the relayout {e_stock:.2f})")

    try:
        run("sharding: the ranks' expert slices sum to the whole layer (reference, all_reduce)", sharding)
        run("kernel: deep_gemm allocates the SM90 MegaMoE symmetric buffer over the EP group", setup)
        run("kernel: fp8_mega_moe at EP=N, each rank's rows == the whole layer's reference (uneven, idle, equal)",
            kernel)
        run("weights: fp8_mega_moe at EP=N after a weight update through the plugin's loader hook", update)
    finally:
        try:
            dist.destroy_process_group()
        except Exception:
            pass


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--world", type=int, default=2, help="ranks (one per GPU): 1, 2 or 4")
    ap.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--deadline", type=float, default=480.0, help="seconds before the parent kills every rank")
    args = ap.parse_args(argv)
    if args.world not in (1, 2, 4):
        ap.error("--world must be 1, 2 or 4 (16 experts split evenly)")
    if args.device == "cuda":
        have = torch.cuda.device_count()
        if have < args.world:
            print(f"FAIL: {args.world} ranks need {args.world} GPUs, {have} visible")
            return 1
        name = torch.cuda.get_device_name(0)
        cap = "".join(map(str, torch.cuda.get_device_capability(0)))
        print(f"torch {torch.__version__}, {have} x {name} (SM{cap}), python {sys.version.split()[0]}", flush=True)
    for k, v in MULTICAST_OFF.items():
        os.environ.setdefault(k, v)
    print("multicast: " + ", ".join(f"{k}={os.environ[k]}" for k in MULTICAST_OFF), flush=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, args.world, port, args.backend, args.device, results))
             for r in range(args.world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + args.deadline
    got: list[tuple[int, str, str, str]] = []
    while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
        try:
            got.append(results.get(timeout=0.5))
        except queue_mod.Empty:
            pass
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join(10)
    while True:
        try:
            got.append(results.get(timeout=0.5))
        except queue_mod.Empty:
            break
    names = list(dict.fromkeys(n for _, n, _, _ in got))
    counts = {"PASS": 0, "FAIL": 0, "SKIP": 0}
    for name in names:
        rows = sorted((r, s, d) for r, n, s, d in got if n == name)
        statuses = {s for _, s, _ in rows}
        status = "FAIL" if "FAIL" in statuses or len(rows) != args.world else (
            "SKIP" if statuses == {"SKIP"} else "PASS" if statuses == {"PASS"} else "FAIL")
        counts[status] += 1
        print(f"{status} {name}", flush=True)
        for r, s, d in rows:
            print(f"    rank {r}: {s} {d}", flush=True)
        if len(rows) != args.world:
            print(f"    only {len(rows)} of {args.world} ranks reported", flush=True)
    bad_exit = [r for r, p in enumerate(procs) if p.exitcode not in (0,) and r not in hung]
    if hung:
        counts["FAIL"] += 1
        print(f"FAIL ranks {hung} still running after {args.deadline:.0f} s: killed", flush=True)
    if bad_exit:
        counts["FAIL"] += 1
        print(f"FAIL ranks {bad_exit} exited with {[procs[r].exitcode for r in bad_exit]}", flush=True)
    print(f"RESULT: {counts['PASS']} PASS, {counts['FAIL']} FAIL, {counts['SKIP']} SKIP (world {args.world}, "
          f"{args.backend}, {args.device})", flush=True)
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
