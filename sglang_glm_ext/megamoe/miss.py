"""The MegaMoE miss path: a batch the kernel cannot take, served over the expert-parallel group. Torch and
torch.distributed only (no SGLang, no deep_gemm): the same code runs over gloo on a CPU and NCCL on GPUs.

Under `--moe-a2a-backend megamoe` every rank's MoE block holds its own rows and the kernel's output rows come back
complete (docs_internal/megamoe.md section 1), so SGLang's stock fused-MoE path, which runs each rank's rows on that
rank's experts only and sums nothing, is wrong for ep > 1. The miss path does what the kernel does, with
collectives and the layer's own experts (SGLang's MiniMax-M3 gathered decode, `models/minimax_m3.py:575-606`,
and the standard dispatcher's all_gatherv / reduce_scatterv, `token_dispatcher/standard.py:166-176, 288-299`,
generalised to uneven counts and idle ranks):

1. every rank's row count over the group (one small all-gather: the sizes);
2. every rank's rows, top-k ids and weights to every rank (`gatherv`);
3. this rank's experts on all the gathered rows (`local_experts`: SGLang's own runner for the layout the layer
   keeps; ids of other ranks' experts contribute nothing), a partial sum per row;
4. each row's partial sums back to the row's owner and summed there (`reduce_scatterv`);
5. the replicated shared expert on the rank's own rows, added after (`shared`).

Collectives: `all_gather_into_tensor` when every rank has the same count (NCCL's ring), `all_to_all_single` with
split sizes otherwise (no padding; gloo and NCCL both implement it); the reduce side always receives each peer's
partial for its rows (`all_to_all_single`) and sums them in fp32, so the result does not depend on which peer sent
first. A rank with 0 rows takes part in every collective with empty splits. Every rank must enter the path for the
same batch: the decision reads only values equal on every rank (`select.decide`).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch

logger = logging.getLogger("sglang_glm_ext")


def _dist():
    import torch.distributed as dist

    return dist


def group_size(group: Any) -> int:
    if group is None:
        return 1
    return int(_dist().get_world_size(group))


def group_rank(group: Any) -> int:
    if group is None:
        return 0
    return int(_dist().get_rank(group))


def _all_gather_into(out: torch.Tensor, inp: torch.Tensor, group: Any) -> None:
    dist = _dist()
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # torch >= 2.14 renamed it
    fn(out, inp, group=group)


def ep_sizes(num_rows: int, group: Any, device: torch.device) -> list[int]:
    """Every rank's row count, in rank order (the same list on every rank)."""
    world = group_size(group)
    if world == 1:
        return [int(num_rows)]
    mine = torch.tensor([int(num_rows)], dtype=torch.int64, device=device)
    out = torch.empty(world, dtype=torch.int64, device=device)
    _all_gather_into(out, mine, group)
    return [int(v) for v in out.tolist()]


def gatherv(t: torch.Tensor, sizes: Sequence[int], group: Any) -> torch.Tensor:
    """[sizes[rank], ...] on each rank -> [sum(sizes), ...] on every rank, rows in rank order."""
    world = len(sizes)
    if world == 1:
        return t
    rank = group_rank(group)
    assert t.shape[0] == sizes[rank], (t.shape, sizes, rank)
    rest = tuple(t.shape[1:])
    t = t.contiguous()
    if len(set(sizes)) == 1:
        out = torch.empty((world * sizes[0], *rest), dtype=t.dtype, device=t.device)
        _all_gather_into(out, t, group)
        return out
    out = torch.empty((sum(sizes), *rest), dtype=t.dtype, device=t.device)
    send = t.repeat((world,) + (1,) * len(rest)) if t.shape[0] else t.new_empty((0, *rest))
    _dist().all_to_all_single(out, send, output_split_sizes=list(sizes), input_split_sizes=[sizes[rank]] * world,
                              group=group)
    return out


def reduce_scatterv(partial: torch.Tensor, sizes: Sequence[int], group: Any) -> torch.Tensor:
    """[sum(sizes), H] partial sums on every rank -> [sizes[rank], H] on each rank: the sum over ranks of that
    rank's rows. Summed in fp32 in rank order, returned in the partial's dtype."""
    world = len(sizes)
    if world == 1:
        return partial
    rank = group_rank(group)
    n = sizes[rank]
    rest = tuple(partial.shape[1:])
    recv = torch.empty((world * n, *rest), dtype=partial.dtype, device=partial.device)
    _dist().all_to_all_single(recv, partial.contiguous(), output_split_sizes=[n] * world,
                              input_split_sizes=list(sizes), group=group)
    return recv.view(world, n, *rest).float().sum(dim=0).to(partial.dtype)


def local_routing(topk_ids: torch.Tensor, *, rank: int, num_local: int) -> torch.Tensor:
    """Global expert ids -> this rank's local ids, -1 for other ranks' experts and for dropped (-1) ids."""
    local = topk_ids.to(torch.int64) - rank * num_local
    keep = (topk_ids >= 0) & (local >= 0) & (local < num_local)
    return torch.where(keep, local, torch.full_like(local, -1)).to(topk_ids.dtype)


@dataclass(frozen=True)
class MissPlan:
    """One batch's miss, as every rank sees it."""

    sizes: tuple[int, ...]
    rank: int

    @property
    def total(self) -> int:
        return sum(self.sizes)

    @property
    def rows(self) -> int:
        return self.sizes[self.rank]


def gathered_moe(hidden_states: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, *, group: Any,
                 local_experts: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
                 shared: Optional[Callable[[], torch.Tensor]] = None,
                 on_plan: Optional[Callable[[MissPlan], None]] = None,
                 sizes: Optional[Sequence[int]] = None) -> torch.Tensor:
    """This rank's rows through every rank's experts (steps 1-5 above). `local_experts(x, ids, weights)` gets all
    the gathered rows with global ids and returns [rows, H]: this rank's experts' weighted sum per row (the
    routed scaling applied as the layer's own path applies it). Rows come back complete for this rank.
    `sizes`: every rank's count when the caller knows it (CUDA-graph capture: every rank captures the same
    padded size, and the count all-gather's host read cannot be captured); all-gathered otherwise."""
    rank = group_rank(group)
    if sizes is None:
        sizes = ep_sizes(hidden_states.shape[0], group, hidden_states.device)
    sizes = [int(n) for n in sizes]
    assert len(sizes) == group_size(group) and sizes[rank] == hidden_states.shape[0], (sizes, rank)
    plan = MissPlan(tuple(sizes), rank)
    if on_plan is not None:
        on_plan(plan)
    x = gatherv(hidden_states, sizes, group)
    ids = gatherv(topk_ids, sizes, group)
    weights = gatherv(topk_weights, sizes, group)
    partial = local_experts(x, ids, weights)
    assert partial.shape[0] == plan.total, (tuple(partial.shape), sizes)
    y = reduce_scatterv(partial, sizes, group)
    if shared is not None and plan.rows > 0:
        y = y + shared()
    return y


def comm_bytes(plan: MissPlan, hidden: int, top_k: int, act_bytes: int = 2) -> int:
    """Bytes this rank sends for one miss of one layer: its rows, ids and weights to every peer, and every peer's
    rows' partial sums back (the cost stated in docs_internal/megamoe.md, section 4)."""
    peers = len(plan.sizes) - 1
    out_rows = plan.rows * peers  # gather: my rows to each peer
    back_rows = plan.total - plan.rows  # reduce: my partials of the others' rows
    return out_rows * (hidden * act_bytes + top_k * 8) + back_rows * hidden * act_bytes


# ---------------------------------------------------------------- counting misses

PROM_COUNTERS = (
    ("sglang:megamoe_miss_layer_batches_total",
     "MoE layer forwards that missed the MegaMoE kernel and took the gathered miss path"),
    ("sglang:megamoe_miss_tokens_total", "Tokens (this rank's rows) of MoE layer forwards that took the miss path"),
)


class MissCounters:
    """Misses per (layer kind, reason): layer-forwards and tokens. Mirrored into `sglang:` Prometheus counters
    when prometheus_client is importable and SGLang's metrics are on (`attach_prometheus`), and logged at most
    once per `log_every_s` per key with the running totals."""

    def __init__(self, log_every_s: float = 60.0):
        self._lock = threading.Lock()
        self.batches: dict[tuple[str, str], int] = {}
        self.tokens: dict[tuple[str, str], int] = {}
        self._last_log: dict[tuple[str, str], float] = {}
        self.log_every_s = log_every_s
        self._prom = None

    def attach_prometheus(self, labels: Optional[dict[str, str]] = None) -> bool:
        try:
            from prometheus_client import Counter
        except ImportError:
            return False
        names = ("layer_kind", "reason", *sorted((labels or {}).keys()))
        made = []
        for name, doc in PROM_COUNTERS:
            try:
                made.append(Counter(name, doc, names))
            except ValueError:  # registered already in this process (another attach): count into that one
                from prometheus_client import REGISTRY

                existing = getattr(REGISTRY, "_names_to_collectors", {}).get(name)
                if existing is None:
                    return False
                made.append(existing)
        self._prom = (made[0], made[1], dict(labels or {}))
        _set_build_info()
        return True

    def count(self, layer_kind: str, reason: str, tokens: int, now: Optional[float] = None) -> None:
        key = (layer_kind, reason)
        with self._lock:
            self.batches[key] = self.batches.get(key, 0) + 1
            self.tokens[key] = self.tokens.get(key, 0) + int(tokens)
            now = time.monotonic() if now is None else now
            due = now - self._last_log.get(key, -1e18) >= self.log_every_s
            if due:
                self._last_log[key] = now
            batches, toks = self.batches[key], self.tokens[key]
        if self._prom is not None:
            b, t, extra = self._prom
            b.labels(layer_kind=layer_kind, reason=reason, **extra).inc()
            t.labels(layer_kind=layer_kind, reason=reason, **extra).inc(int(tokens))
        if due:
            logger.info("sglang-glm-ext megamoe: %s layers missed the MegaMoE kernel (%s): %d layer forwards, %d "
                        "tokens so far; served by the gathered miss path", layer_kind, reason, batches, toks)

    def snapshot(self) -> dict[str, dict[str, int]]:
        with self._lock:
            return {f"{k}/{r}": {"batches": b, "tokens": self.tokens[(k, r)]} for (k, r), b in self.batches.items()}


COUNTERS = MissCounters()


def _set_build_info() -> None:
    """The plugin's build-info gauge, which L3's metrics set too (l3/hicache/metrics.py): one family per process,
    whichever feature registers it first; a MegaMoE-only launch has it as well."""
    from importlib import metadata

    from prometheus_client import REGISTRY, Gauge

    name = "sglang:glm_ext_build_info"
    try:
        gauge = Gauge(name, "1; the plugin's and SGLang's versions as labels.", ("version", "sglang_version"),
                      multiprocess_mode="mostrecent")
    except ValueError:  # L3's metrics registered it first
        gauge = getattr(REGISTRY, "_names_to_collectors", {}).get(name)
    versions = {}
    for label, dist in (("version", "sglang-glm-ext"), ("sglang_version", "sglang")):
        try:
            versions[label] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[label] = "unknown"
    if gauge is not None:
        gauge.labels(**versions).set(1)


_MARK = "<!-- generated by python -m sglang_glm_ext.megamoe.miss --reference: {} -->"


def reference() -> str:
    """The MegaMoE part of docs/metrics.md, from PROM_COUNTERS."""
    rows = ["| metric | type | labels | meaning |", "|---|---|---|---|"]
    rows += [f"| `{name}` | counter | layer_kind, reason | {doc}. |" for name, doc in PROM_COUNTERS]
    return "\n".join(rows) + "\n"


def _main(argv: list[str]) -> int:
    if argv[:1] != ["--reference"] or len(argv) != 2:
        print("usage: python -m sglang_glm_ext.megamoe.miss --reference docs/metrics.md", file=sys.stderr)
        return 2
    with open(argv[1], encoding="utf-8") as f:
        doc = f.read()
    begin, end = _MARK.format("megamoe begin"), _MARK.format("megamoe end")
    head, rest = doc.split(begin, 1)
    with open(argv[1], "w", encoding="utf-8") as f:
        f.write(head + begin + "\n" + reference() + end + rest.split(end, 1)[1])
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
