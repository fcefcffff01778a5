"""Memory of one ModelOpt NVFP4 MoE layer under three builds, measured side by side on the same checkpoint.

  trtllm  : --moe-a2a-backend none, FlashInfer TRTLLM (the fallback layout, no MegaMoE)
  stock   : --moe-a2a-backend megamoe with SGLANG_GLM_EXT_MEGAMOE_FP4_KEEP_TRTLLM=0 (0.5.23: in-place MegaMoE
            repack, no fallback)
  shared  : --moe-a2a-backend megamoe, the plugin's default (TRTLLM layout kept, MegaMoE views of it)

Real SGLang 0.5.23 layers on a CPU, built, loaded and prepared by SGLang's own code (tests/megamoe/fp4_harness.py;
FlashInfer's shuffles are faked with same-size permutations, which do not change sizes). Bytes are the distinct
storages behind every parameter and MegaMoE tensor of the layer. The GLM-5.x projection multiplies the per-expert
bytes by 32 local experts (256 experts, EP8) and 75 MoE layers (public config; not measured on a GPU).

Run: cd <checkout> && PYTHONPATH=. .venv/bin/python benchmark/megamoe_fp4_memory.py [--hidden 6144 --inter 2048]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "megamoe"))

import fp4_harness as H  # noqa: E402


def build(ck, a2a, runner, keep):
    os.environ["SGLANG_GLM_EXT_MEGAMOE_FP4_KEEP_TRTLLM"] = keep
    with H.sglang_runtime(quantization="modelopt_fp4", a2a=a2a, runner=runner):
        layer = H.build_nvfp4_layer(ck)
        H.load_nvfp4(layer, ck)
        layer.quant_method.process_weights_after_loading(layer)
    return layer


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=6144)
    ap.add_argument("--inter", type=int, default=2048)
    ap.add_argument("--experts", type=int, default=2)
    ap.add_argument("--local-experts-per-gpu", type=int, default=32)
    ap.add_argument("--moe-layers", type=int, default=75)
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    import sglang_glm_ext as plugin

    plugin.register()
    ck = H.Checkpoint.random(args.experts, args.hidden, args.inter)
    rows = {}
    with H.FakeFlashInfer().installed():
        for name, a2a, runner, keep in (("trtllm", "none", "flashinfer_trtllm", "1"), ("stock", "megamoe", "auto", "0"),
                                        ("shared", "megamoe", "auto", "1")):
            t0 = time.perf_counter()
            layer = build(ck, a2a, runner, keep)
            rows[name] = (H.param_bytes(layer), time.perf_counter() - t0, bool(layer._mega_moe_weights_built),
                          getattr(layer, "_mega_moe_trtllm_layout", False))
    base = rows["trtllm"][0]
    per_gpu = args.local_experts_per_gpu * args.moe_layers / args.experts
    print(f"NVFP4 MoE layer, hidden={args.hidden} moe_intermediate={args.inter}, {args.experts} experts (CPU, real SGLang)")
    print(f"{'build':<8} {'MegaMoE':>8} {'fallback':>9} {'bytes/layer':>13} {'vs trtllm':>10} {'extra/layer':>12} "
          f"{'GLM-5.x extra/GPU':>18} {'build s':>8}")
    for name, (nbytes, secs, mega, trt) in rows.items():
        fallback = "yes" if name != "stock" else "no"
        extra = nbytes - base
        print(f"{name:<8} {('yes' if mega else 'no'):>8} {fallback:>9} {nbytes:>13,} {nbytes / base:>10.4f} "
              f"{extra:>12,} {H.fmt(extra * per_gpu):>18} {secs:>8.2f}")
    sidecar = rows["stock"][0]
    print(f"a full sidecar (MegaMoE copy next to TRTLLM) would add {sidecar:,} B/layer here, "
          f"{H.fmt(sidecar * per_gpu)} per GPU for GLM-5.x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
