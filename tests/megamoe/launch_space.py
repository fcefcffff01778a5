"""The MegaMoE launch space and SGLang's own bounds on it, for test_launch_space.py (test side only).

`sglang_bounds(server_args)` answers "what is the largest batch SGLang's scheduler can hand one rank's MegaMoE
gate under these resolved arguments?" by running SGLang's own sizing code in a runtime context built from them
(`runtime_context.create_context` + `use_context`, `initialize_moe_config`), never a copy of its formulas:

- prefill: `runtime_context.max_prefill_buffer_tokens()` (the DP-adjusted chunk, or PP dynamic chunking's
  ceiling), then the per-DP-rank padding `ForwardBatch.prepare_mlp_sync_batch` applies before the gate reads
  `get_dp_global_num_tokens()` (ceil to attention TP, forward_batch_info.py:1770-1772; a prefill CUDA-graph
  bucket when one covers it, :1800-1810); under DSA prefill CP the gate reads the rank's own rows
  (mega_moe.py:186-191), a 1/attn_cp share;
- decode, verify and draft: SGLang's `EagerRunner` sizing (`_eager_max_bs` via `get_eager_max_batch_size`,
  `_eager_num_tokens_per_req` via `max_speculative_num_draft_tokens` / the draft-worker rule) for the target
  and, under speculative decoding, the draft worker, on `KVCacheConfigurator.resolve_max_num_reqs`'s
  per-worker request cap; and the largest decode CUDA-graph bucket `get_batch_sizes_to_capture` would capture
  (capture always takes the kernel, mega_moe.py:184).

Only objects SGLang reads through duck typing are stand-ins (the model runner's attributes; the TBO graph
plugin, which allocates a CUDA tensor and sizes nothing).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Optional

from sglang.srt.utils.common import ceil_align


@dataclass
class Bounds:
    prefill: int = 0  # largest tokens per rank the gate compares with the cap on a prefill / extend batch
    decode: int = 0  # ... on a decode, verify or draft batch (eager or captured)
    captured: int = 0  # the largest CUDA-graph capture (decode or prefill): capture always runs the kernel
    detail: dict = field(default_factory=dict)

    @property
    def largest(self) -> int:
        return max(self.prefill, self.decode)


def sglang_bounds(server_args) -> Bounds:
    from sglang.srt.layers.moe.utils import initialize_moe_config
    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
    from sglang.srt.model_executor import model_runner as model_runner_mod
    from sglang.srt.model_executor.runner import base_runner
    from sglang.srt.model_executor.runner.base_cuda_graph_runner import get_batch_sizes_to_capture
    from sglang.srt.model_executor.runner.eager_runner import EagerRunner
    from sglang.srt.runtime_context import (
        create_context, get_disagg, get_exec, get_parallel, get_schedule, get_spec, max_prefill_buffer_tokens,
        use_context,
    )
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    out = Bounds()
    ctx = create_context(server_args, role="test")
    with use_context(ctx):
        initialize_moe_config()
        par = get_parallel()
        mode = get_disagg().disaggregation_mode
        graphs = get_exec().graph.cuda_graph_config
        if mode != "decode":
            ceiling = max_prefill_buffer_tokens()
            if par.attn_cp_size > 1 and get_schedule().enable_prefill_cp:
                tokens = -(-ceiling // par.attn_cp_size)
            else:
                tokens = ceil_align(ceiling, par.attn_tp_size)
                pre = graphs.prefill if graphs is not None else None
                if pre is not None and str(pre.backend) != "disabled" and pre.bs:
                    out.captured = max(out.captured, max(pre.bs))
                    if tokens <= max(pre.bs):
                        tokens = min(b for b in pre.bs if b >= tokens)
            out.prefill = tokens
            out.detail["prefill_ceiling"] = ceiling
        if mode != "prefill":
            per_worker = KVCacheConfigurator.resolve_max_num_reqs(
                SimpleNamespace(model_config=SimpleNamespace(context_len=4096), attn_dp_size=par.attn_dp_size,
                                mambaish_config=None), 10 ** 9)
            algo = SpeculativeAlgorithm.from_string(get_spec().speculative_algorithm)
            saved = base_runner.TboCudaGraphRunnerPlugin
            base_runner.TboCudaGraphRunnerPlugin = lambda: None  # allocates a CUDA tensor; sizes nothing
            try:
                for draft in ((False, True) if algo.is_speculative() else (False,)):
                    mr = SimpleNamespace(
                        server_args=server_args, spec_algorithm=algo, is_draft_worker=draft,
                        max_running_requests=per_worker, max_total_num_tokens=1, device="cpu",
                        model_config=SimpleNamespace(is_encoder_decoder=False, hf_config=SimpleNamespace()),
                        req_to_token_pool=SimpleNamespace(size=per_worker))
                    mr.decode_num_tokens_per_req = (
                        lambda num_draft_tokens=None, mr=mr: model_runner_mod.ModelRunner.decode_num_tokens_per_req(
                            mr, num_draft_tokens=num_draft_tokens))
                    eager = EagerRunner(mr, run_warmup=False)
                    bs, width = eager._eager_max_bs, eager._eager_num_tokens_per_req
                    captured = 0
                    if graphs is not None and str(graphs.decode.backend) != "disabled":
                        try:
                            captured = max(get_batch_sizes_to_capture(mr)[0])
                        except AssertionError:  # SGLang finds no bucket to capture: its own startup fails
                            out.detail["no_decode_graph_bucket"] = True
                    tokens = ceil_align(max(bs, captured) * width, par.attn_tp_size)
                    out.decode = max(out.decode, tokens)
                    out.captured = max(out.captured, ceil_align(captured * width, par.attn_tp_size))
                    out.detail["draft" if draft else "target"] = dict(eager_bs=bs, width=width, graph_bs=captured,
                                                                    per_worker=per_worker)
            finally:
                base_runner.TboCudaGraphRunnerPlugin = saved
    return out


# ---------------------------------------------------------------- the space

CAPS = (64, 256, 1024, 8192)
CHUNKS = (64, 256, 1000, 1024, 2048, 4096, 16384)
REQUESTS = (None, 1, 7, 31, 33, 63, 64, 65, 128, 256, 1000)


def sample(n: int, seed: int, adaptive_config: str) -> list[dict[str, Any]]:
    """n launch configurations: {"cap": int, "args": ServerArgs keywords}. Deterministic for a seed."""
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        tp = rng.choice((1, 2, 4, 8))
        args: dict[str, Any] = dict(tp_size=tp, chunked_prefill_size=rng.choice(CHUNKS),
                                    max_running_requests=rng.choice(REQUESTS))
        if tp > 1 and rng.random() < 0.4:
            args.update(dp_size=rng.choice([d for d in (2, 4, 8) if d <= tp and tp % d == 0]),
                        enable_dp_attention=True)
        r = rng.random()
        if r < 0.15:
            args.update(cuda_graph_max_bs_decode=rng.choice((8, 32, 80)))
        elif r < 0.25:
            args.update(disable_decode_cuda_graph=True)
        elif r < 0.35:
            args.update(cuda_graph_backend_prefill="breakable",
                        cuda_graph_bs_prefill=rng.choice(([256, 512, 1024], [1024, 2048, 4096])))
        s = rng.random()
        if s < 0.25:
            topk = rng.choice((1, 4, 8))
            steps = rng.choice((1, 3))
            args.update(speculative_algorithm="EAGLE", speculative_num_steps=steps, speculative_eagle_topk=topk,
                        speculative_num_draft_tokens=rng.choice((2, 4)) if topk > 1 else steps + 1)
        elif s < 0.35:
            args.update(speculative_algorithm="EAGLE", speculative_adaptive=True,
                        speculative_adaptive_config=adaptive_config, speculative_num_steps=3,
                        speculative_eagle_topk=1, speculative_num_draft_tokens=4)
        if rng.random() < 0.15:
            args.update(pp_size=2, enable_dynamic_chunking=rng.random() < 0.7)
        if rng.random() < 0.1 and "speculative_algorithm" not in args:
            args.update(enable_mixed_chunk=True)
        out.append({"cap": rng.choice(CAPS), "args": args})
    return out


def write_adaptive_config(path) -> str:
    path.write_text(json.dumps({"1": {"candidate_steps": [1, 3, 7]}, "64": {"candidate_steps": [1, 3]}}))
    return str(path)


def describe(case: dict[str, Any]) -> str:
    return f"cap={case['cap']} " + " ".join(f"{k}={v}" for k, v in case["args"].items() if k != "model_path")


def flag_named(message: str) -> bool:
    """A refusal names what to change: a launch flag or the cap's env var."""
    return "--" in message or "SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK" in message


def one_line_each(message: str) -> bool:
    return all(line.strip() for line in message.strip().splitlines())


def maybe(x: Optional[int]) -> str:
    return "-" if x is None else str(x)
