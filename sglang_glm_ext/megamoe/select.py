"""Per batch: does a GLM MoE layer run the MegaMoE kernel, or is the batch refused? Pure; no SGLang import.

The kernel is a collective over the MoE expert-parallel group: if one rank runs it and another does not, both
hang. So the decision is a function of values that are identical on every rank of that group, and of nothing
else (see `GateInputs`). Mirrors SGLang 0.5.23's `should_use_mega_moe` (layers/moe/mega_moe.py:172-193) for the
cases where it says yes; where it says no under megamoe, SGLang would run its stock fused-MoE path, which is
wrong there for tp > 1 (docs_internal/megamoe.md), so this module says REFUSE and the hooks raise.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional, Sequence


class Path(str, enum.Enum):
    # The a2a backend is not megamoe: SGLang's own paths are correct, leave the layer alone.
    STOCK = "stock"
    MEGA = "mega"
    # Under megamoe, the kernel cannot take this batch, and the layer keeps a layout SGLang's own runner reads:
    # the gathered miss path (miss.py) serves it, on every rank of the group alike.
    MISS = "miss"
    # Under megamoe, the kernel cannot take this batch and the layer keeps no layout another runner reads; the
    # stock path would compute a wrong answer. The launch and load checks refuse what could get here.
    REFUSE = "refuse"


@dataclass(frozen=True)
class GateInputs:
    """Everything the decision reads. Each field is identical on every rank of the MoE EP group:

    - megamoe: the launch's a2a backend (server arguments, the same everywhere).
    - weights_ready: whether this layer's MegaMoE weights are built and this GPU runs them. Every rank builds
      the same layers from the same checkpoint at load; the load check (hooks) refuses a launch where a layer
      is not ready, so at serving time this is True on all ranks.
    - capture: CUDA-graph capture is collective (every rank captures the same shapes together).
    - global_num_tokens: the per-DP-rank token counts SGLang all-gathers before the forward (None without
      DP attention): the same list on every rank.
    - local_rows: this rank's MoE input rows. Used only when there is no global list (no DP attention, or DSA
      prefill CP, as SGLang does): then every rank of the group runs the same batch, split over attention TP
      into equal padded slices or kept whole (layer_boundary/factories.py:163-175), so it is equal too.
    - cap: SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK (one environment for the whole launch).
    - fallback: whether the layer keeps a layout the miss path's runner reads (fixed at load, the same checkpoint
      and code on every rank).
    """

    megamoe: bool
    weights_ready: bool
    capture: bool
    global_num_tokens: Optional[Sequence[int]]
    local_rows: int
    cap: int
    use_global_num_tokens: bool = True
    fallback: bool = False


@dataclass(frozen=True)
class Decision:
    path: Path
    tokens_per_rank: int = 0
    reason: str = ""

    @property
    def mega(self) -> bool:
        return self.path is Path.MEGA


def tokens_per_rank(inp: GateInputs) -> int:
    """The per-rank token count the cap is compared with (SGLang's rule, mega_moe.py:187-191)."""
    if inp.global_num_tokens and inp.use_global_num_tokens:
        return int(max(inp.global_num_tokens))
    return int(inp.local_rows)


def decide(inp: GateInputs) -> Decision:
    """MEGA, STOCK or REFUSE for one batch of one layer. Invariant: equal inputs give equal decisions, and
    under megamoe the answer is never STOCK."""
    if not inp.megamoe:
        return Decision(Path.STOCK)
    miss = Path.MISS if inp.fallback else Path.REFUSE
    if not inp.weights_ready:
        return Decision(miss, tokens_per_rank(inp), NOT_READY)
    if inp.capture:
        # Capture sizes are bounded by the startup budget check; a captured graph must hold the kernel.
        return Decision(Path.MEGA, tokens_per_rank(inp))
    tokens = tokens_per_rank(inp)
    if tokens > inp.cap:
        return Decision(miss, tokens, OVER_CAP)
    return Decision(Path.MEGA, tokens)


# Miss reasons (also the `reason` label of the miss counters).
NOT_READY = "not_ready"  # the layer has no MegaMoE weights this GPU runs (bf16, FP8 on SM100, excluded layers)
OVER_CAP = "over_cap"  # more tokens per rank than SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK


class MegaMoEMissError(RuntimeError):
    """A batch under --moe-a2a-backend megamoe that the MegaMoE kernel cannot take.

    Raised instead of running SGLang's stock fused-MoE path, whose result is wrong under megamoe for tp > 1.
    Every rank raises it for the same batch (the decision reads only rank-identical values), so no rank is left
    waiting in the kernel's collective.
    """


def reason_text(decision: Decision, cap: int) -> str:
    if decision.reason == OVER_CAP:
        return (f"{decision.tokens_per_rank} tokens per rank exceed SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK"
                f"={cap}")
    if decision.reason == NOT_READY:
        return "this layer has no MegaMoE weights this GPU can run"
    return decision.reason


def miss_message(layer: str, decision: Decision, cap: int = 0) -> str:
    return (
        f"sglang-glm-ext megamoe: {layer}: {reason_text(decision, cap)}, and it keeps no layout another runner reads. "
        "Under --moe-a2a-backend megamoe each rank's MoE "
        "input is its own slice of the tokens and nothing sums the stock path's output across ranks, so running "
        "SGLang's fused-MoE fallback would return wrong tokens; refusing instead. Fix the launch: raise "
        "SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK or lower --chunked-prefill-size / "
        "--max-running-requests / --cuda-graph-max-bs-decode (the startup check names the bound), or use another "
        "--moe-a2a-backend."
    )
