#!/usr/bin/env python3
"""GPU check (torch only, no SGLang): the L3 HiCache backend's page plans over PINNED host memory filled by real
CUDA D2H copies, through the L3 engine and back to the device, byte-exact.

What SGLang's host pools look like on a GPU node: cudaHostRegister'd / pinned host tensors that the copy kernels
fill by DMA. This builds GLM-5-shaped host buffers (MLA KV 64 tokens x 78 layers x 656 B per page, DSA indexer
page 78 x 8448 B) in pinned memory for page_first and layer_first, fills them from random CUDA tensors (D2H),
plans them with ``sglang_glm_ext.l3.hicache.pool_plans.plan_pool`` (the same planner the backend uses), spills every
page to L3 (``spill_from_layout``), zeroes the host buffers, reloads (``reload_into_layout``), copies back H2D and
compares on the GPU. Prints GB/s for spill->durable and reload per layout, and "OK" only if every byte matched.

Run on the GPU box:  cd /work/main && PYTHONPATH=. python3 scripts/gpu/l3_hicache_pinned.py --dir /tmp/l3pin --pages 128
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/l3_hicache_pinned")
    ap.add_argument("--pages", type=int, default=128)
    ap.add_argument("--layers", type=int, default=78)
    ap.add_argument("--cpu", action="store_true", help="dry run of the script's logic without a GPU (no pinning)")
    args = ap.parse_args(argv)

    import torch

    from sglang_glm_ext.l3.config import L3Config
    from sglang_glm_ext.l3.disk.format import PayloadKind
    from sglang_glm_ext.l3.hicache.keys import NamespaceSpec, ShardIdentity, storage_keys
    from sglang_glm_ext.l3.hicache.pool_plans import Buffer, PoolGeometry, plan_pool
    from sglang_glm_ext.l3.engine.store import L3Store

    dev, pin = ("cpu", False) if args.cpu else ("cuda", True)
    assert args.cpu or torch.cuda.is_available(), "needs a CUDA GPU (or --cpu for a dry run)"
    ps, L, row, stride, n = 64, args.layers, 656, 8448, args.pages
    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.dir)
    ok_all = True
    for layout in ("page_first", "layer_first"):
        kv_shape = (n * ps, L, row) if layout == "page_first" else (L, n * ps, row)
        ix_shape = (n, L, stride) if layout == "page_first" else (L, n, stride)
        host_kv = torch.empty(kv_shape, dtype=torch.uint8, pin_memory=pin)
        host_ix = torch.empty(ix_shape, dtype=torch.uint8, pin_memory=pin)
        dev_kv = torch.randint(0, 256, kv_shape, dtype=torch.uint8, device=dev)
        dev_ix = torch.randint(0, 256, ix_shape, dtype=torch.uint8, device=dev)
        host_kv.copy_(dev_kv, non_blocking=True)
        host_ix.copy_(dev_ix, non_blocking=True)
        if pin:
            torch.cuda.synchronize()
        kv = plan_pool(PoolGeometry("kv", "mla", layout, ps, n, L, row,
                                    (Buffer(host_kv.data_ptr(), host_kv.nbytes),)))
        ix = plan_pool(PoolGeometry("indexer", "dsa_indexer", layout, ps, n, L, stride,
                                    (Buffer(host_ix.data_ptr(), host_ix.nbytes),)))
        d = os.path.join(args.dir, layout)
        cfg = L3Config.from_dict({"deployment_id": f"pinned-{layout}",
                                  "disks": [{"path": os.path.join(d, "disk"), "budget": 3 * n * 4_200_000}],
                                  "index": {"path": os.path.join(d, "index")},
                                  "queues": {"staging_bytes": "1GiB", "max_inflight": 4096}})
        ns = NamespaceSpec("pinned", "glm-5", "float8_e4m3fn", layout, ps, 0, L, (kv.fmt, ix.fmt),
                           ShardIdentity(replicated=True)).to_namespace()
        store = L3Store.open(cfg, rank=0, namespace=ns,
                             page_bytes={PayloadKind.TARGET_KV: kv.page_bytes, PayloadKind.INDEX_K: ix.page_bytes})
        keys = storage_keys([f"{layout}-{p}" for p in range(n)])
        pages = list(range(n))
        total = n * (kv.page_bytes + ix.page_bytes)
        t = time.perf_counter()
        for i in range(0, n, 128):
            assert all(store.spill_from_layout(PayloadKind.TARGET_KV, keys[i:i + 128], kv.layout, pages[i:i + 128]))
            assert all(store.spill_from_layout(PayloadKind.INDEX_K, keys[i:i + 128], ix.layout, pages[i:i + 128]))
        store.flush(None)
        w = time.perf_counter() - t
        host_kv.zero_()
        host_ix.zero_()
        t = time.perf_counter()
        for i in range(0, n, 128):
            assert all(store.reload_into_layout(PayloadKind.TARGET_KV, keys[i:i + 128], kv.layout, pages[i:i + 128]))
            assert all(store.reload_into_layout(PayloadKind.INDEX_K, keys[i:i + 128], ix.layout, pages[i:i + 128]))
        r = time.perf_counter() - t
        back_kv = host_kv.to(dev, non_blocking=True)
        back_ix = host_ix.to(dev, non_blocking=True)
        if pin:
            torch.cuda.synchronize()
        same = torch.equal(back_kv, dev_kv) and torch.equal(back_ix, dev_ix)
        ok_all &= same
        print(f"{layout:<12} pinned={pin and host_kv.is_pinned()} {n} pages {total / 1e9:.2f} GB: spill->durable "
              f"{total / w / 1e9:.2f} GB/s, reload {total / r / 1e9:.2f} GB/s, bytes {'exact' if same else 'DIFFER'}")
        store.close()
    shutil.rmtree(args.dir, ignore_errors=True)
    print("OK" if ok_all else "FAILED")
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
