"""MegaMoE's part of `doctor`: which MegaMoE kernels this node and its deep_gemm can run, and why not.

Two `hardware` keys (schema 1; `fp4_megamoe`'s first two keys are the original ones, the rest are additions):
- `fp4_megamoe`: {possible, why} (FP4 kernels are SM100-only, deep_gemm installed), the installed `deep_gemm`
  version, and `trtllm_layout`: {supported, why} (does it read NVFP4 weights on FlashInfer's TRTLLM layout).
- `megamoe`: {fp8_sm90, fp4_sm100: {possible, why}, deep_gemm: {version, imports, error}, retired_env: [names],
  dg_use_fp4_acts_set}.

- `megamoe.shared_expert` (addition): the GPU memory GLM-4.x's shared expert costs per GPU under megamoe, where
  the plugin replicates it (so the kernel's complete rows need no all-reduce), against TP sharding at `--tp-size`
  (8 when not given): for the model at `--model-path` (a local directory's config.json) when given, and for the
  released GLM-4.x checkpoints always.

Problems: a retired fork switch or DG_USE_FP4_ACTS set (either stops a launch), and, when the launch being
checked asks for megamoe (`doctor --moe-a2a-backend megamoe`), a node on which no MegaMoE kernel can run.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace
from typing import Any, Mapping, Sequence

from ..declare import DoctorInput, DoctorPart, DoctorReporter, Problem
from . import glm4, guard, hardware
from .feature import FEATURE


def report(inp: DoctorInput) -> DoctorPart:
    version = inp.versions.get("deep_gemm")
    fp4 = {**fp4_megamoe(inp.gpus, version), "deep_gemm": version, "trtllm_layout": hardware.trtllm_layout()}
    megamoe = hardware.doctor_part(list(inp.gpus))
    problems = hardware.doctor_problems(megamoe)
    node = launch_problems(megamoe)  # no MegaMoE kernel runs here: megamoe is unavailable on this node
    if FEATURE.switched_on(inp.values, SimpleNamespace(**inp.launch)):  # doctor --moe-a2a-backend megamoe
        problems += node
    megamoe["shared_expert"] = shared_expert_part(inp.launch.get("model_path"), inp.launch.get("tp_size"))
    return DoctorPart({"fp4_megamoe": fp4, "megamoe": megamoe}, tuple(problems),
                      unavailable={FEATURE.name: node[0].removeprefix("--moe-a2a-backend megamoe: ")} if node else {})


def _cost_row(name: str, cost: glm4.SharedExpertCost) -> dict[str, Any]:
    return {"model": name, "moe_layers": cost.moe_layers, "weight_format": cost.weight_format,
            "replicated_per_gpu_bytes": cost.replicated_bytes, "tp_sharded_per_gpu_bytes": cost.tp_sharded_bytes,
            "extra_per_gpu_bytes": cost.extra_bytes}


def shared_expert_part(model_path: Any = None, tp_size: Any = None) -> dict[str, Any]:
    """What replicating GLM-4.x's shared expert under megamoe costs per GPU, vs TP sharding at tp_size."""
    try:
        tp = max(int(tp_size), 1) if tp_size not in (None, "") else 8
    except (TypeError, ValueError):
        tp = 8
    out: dict[str, Any] = {"tp_size": tp, "model": None, "why": "",
                           "known": [_cost_row(n, glm4.shared_expert_cost(c, tp)) for n, c in glm4.KNOWN_GLM4.items()]}
    if not model_path:
        return out
    path = os.path.join(str(model_path), "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError) as exc:
        out["why"] = f"cannot read {path}: {exc} (give a local model directory)"
        return out
    arch = (config.get("architectures") or [""])[0]
    if arch not in guard.GLM4_BLOCK_ARCHS:
        out["why"] = f"{arch or 'this model'} is not a GLM-4.x MoE model: its shared expert is SGLang's to lay out"
        return out
    text = config.get("text_config") or config
    if "quantization_config" in config and "quantization_config" not in text:
        text = dict(text, quantization_config=config["quantization_config"])
    cost = glm4.shared_expert_cost(text, tp)
    if cost is None:
        out["why"] = "no separate shared expert (none, or fused into the routed experts)"
        return out
    out["model"] = _cost_row(str(model_path), cost)
    return out


def fp4_megamoe(gpu_list: Sequence[Mapping[str, Any]], deep_gemm_version: str | None) -> dict[str, Any]:
    if not gpu_list:
        return {"possible": False, "why": "no CUDA GPU visible"}
    if not all(g["sm"] // 10 == 10 for g in gpu_list):
        sms = sorted({g["sm"] for g in gpu_list})
        return {"possible": False, "why": f"FP4 MegaMoE kernels are SM100-only; this node has SM {sms}"}
    if deep_gemm_version is None:
        return {"possible": False, "why": "deep_gemm is not installed"}
    return {"possible": True, "why": ""}


def launch_problems(part: Mapping[str, Any]) -> list[str]:
    """A megamoe launch on this node: refused at startup unless some MegaMoE kernel can run here."""
    kernels = ("fp8_sm90", "fp4_sm100")
    if any(part[k]["possible"] for k in kernels):
        return []
    return [Problem("--moe-a2a-backend megamoe: no MegaMoE kernel can run on this node (" +
                    "; ".join(f"{k}: {part[k]['why']}" for k in kernels) + ")",
                    fix="serve it on SM90 GPUs (FP8 experts) or SM100 (FP4) with deep_gemm installed, or choose "
                        "another --moe-a2a-backend")]


def _gb(n: int) -> str:
    from .fp4_layout import fmt_bytes  # imports torch: the CLI's light commands never reach this

    return f"{n / 1e9:.2f} GB" if n >= 10 ** 8 else fmt_bytes(n)


def render_shared_expert(part: Any) -> list[str]:
    """doctor's text lines for `megamoe_shared_expert`."""
    if not part:
        return []
    tp = part["tp_size"]
    rows = [part["model"]] if part.get("model") else part["known"]
    lines = []
    for r in rows:
        lines.append(f"  MegaMoE GLM-4.x shared expert ({r['model']}, {r['moe_layers']} MoE layers, "
                     f"{r['weight_format']}): {_gb(r['replicated_per_gpu_bytes'])} per GPU replicated under megamoe; "
                     f"TP-sharded over {tp}: {_gb(r['tp_sharded_per_gpu_bytes'])} "
                     f"(replication costs {_gb(r['extra_per_gpu_bytes'])} more)")
    if part.get("why"):
        lines.append(f"  MegaMoE shared expert for --model-path: {part['why']}")
    return lines


def render(hardware: Mapping[str, Any], sections: Mapping[str, Any]) -> list[str]:
    """doctor's text lines for `fp4_megamoe` and `megamoe`."""
    fp4, mm = hardware["fp4_megamoe"], hardware["megamoe"]
    lines = [f"  FP4 MegaMoE: {'possible' if fp4['possible'] else fp4['why']}"]
    lines.append("  MegaMoE: " + "; ".join(
        f"{k} {'possible' if mm[k]['possible'] else 'no: ' + mm[k]['why']}" for k in ("fp8_sm90", "fp4_sm100"))
        + f"; deep_gemm {mm['deep_gemm']['version'] or 'absent'}"
        + ("" if mm["deep_gemm"]["imports"] or not mm["deep_gemm"]["error"] else f" ({mm['deep_gemm']['error']})")
        + ("; NVFP4 on the TRTLLM layout: " + ("yes" if fp4["trtllm_layout"]["supported"]
                                                 else fp4["trtllm_layout"]["why"])))
    return lines + render_shared_expert(mm.get("shared_expert"))


REPORTER = DoctorReporter(report, render, hardware=("fp4_megamoe", "megamoe"))
