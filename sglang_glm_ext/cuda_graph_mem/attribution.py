"""CUDA-graph memory attribution: buffer tables, cross-family aliasing, per-shape pool deltas.

Torch only, no SGLang import: this module must load next to any torch (the H200 proof runs it with torch 2.11
and no SGLang) and test on a CPU. The SGLang side lives in hooks.py.

Three questions a capture log answers, one object each:
- what static buffers does a runner hold?              `buffer_rows` -> [BufferRow]
- which of them live in memory an earlier runner owns? `AliasRegistry.check_and_register`
- how much did the graph pool grow for each shape?     `PoolDeltaRecorder.shape(label)` around one capture
`FamilyReport` puts them together and formats the log lines.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

import torch

logger = logging.getLogger("sglang_glm_ext")

MIB = 1 << 20
LEGACY_PICKLE = "cuda_graph_runner_memory_usage.pickle"

# Reads allocator counters (bytes) at one instant; keys are whatever the reader reports (reserved, allocated,
# pool, pool_live). Injectable so CPU tests drive the recorder with scripted numbers.
StatsFn = Callable[[], Mapping[str, int]]


# ---------------------------------------------------------------- family naming

def family_name(class_name: str, forward_mode: Any = None, *, is_draft_worker: bool = False) -> str:
    """The runner family a decode-graph runner belongs to.

    Invariant: the draft-extend class is never named `draft` (its name contains "Draft" too, so it is tested
    first), and the base runner is told apart by the forward mode it captures, not by its class.
    """
    lowered = class_name.lower()
    if "draftextend" in lowered:
        return "draft_extend"
    if "draft" in lowered:
        return "draft"
    mode = getattr(forward_mode, "name", None) or (str(forward_mode).rsplit(".", 1)[-1] if forward_mode else "")
    mode = mode.lower()
    base = {"target_verify": "target_verify", "decode": "decode", "": "decode"}.get(mode, mode)
    # DSpark/DFlash draft workers capture with the base class at the target's shapes; without the prefix
    # their label (and pickle) would collide with the target's.
    return f"draft_{base}" if is_draft_worker else base


class Labels:
    """Hands out one label per runner. Invariant: labels are unique in the process; the first runner of a
    family gets the bare family name, the n-th `family#n` (adaptive speculative decoding builds several runners
    of one family)."""

    def __init__(self) -> None:
        self._count: dict[str, int] = {}

    def assign(self, family: str) -> str:
        n = self._count.get(family, 0) + 1
        self._count[family] = n
        return family if n == 1 else f"{family}#{n}"


def pickle_filename(label: str, tp_rank: int = 0) -> str:
    """Memory-snapshot file for one runner. Invariant: distinct (label, rank) pairs never share a file, so no
    runner and no rank overwrites another's snapshot (the bug in SGLang's fixed LEGACY_PICKLE name)."""
    stem = label.replace("#", "_")
    return f"cuda_graph_mem_{stem}.pickle" if tp_rank == 0 else f"cuda_graph_mem_{stem}_tp{tp_rank}.pickle"


def shape_label(size: int, stream_idx: Any = None, variant_label: Any = None, attention_variant: Any = None) -> str:
    """One captured graph's name, as the capture loop distinguishes them (bs x lora variant x attention
    variant x pdmux stream); absent parts are left out so single-variant runners read `bs=8`."""
    parts = [f"bs={size}"]
    parts += [str(p) for p in (attention_variant, variant_label) if p is not None]
    if stream_idx is not None:
        parts.append(f"stream{stream_idx}")
    return "/".join(parts)


# ---------------------------------------------------------------- buffer table

@dataclass(frozen=True)
class BufferRow:
    name: str
    shape: tuple[int, ...]
    dtype: str
    device: str
    nbytes: int  # logical bytes: numel * element_size (what this view addresses, not its storage's size)
    span: tuple[int, int] | None  # [first byte, past last byte) the view can touch; None: no storage (empty/meta)
    alias_of: str = ""  # "label.name" of the earlier runner's buffer this one overlaps
    partial: bool = False  # overlaps, but not wholly inside, that buffer

    @property
    def mib(self) -> float:
        return self.nbytes / MIB

    @property
    def is_host(self) -> bool:
        return self.device == "cpu"


def tensor_span(t: torch.Tensor) -> tuple[int, int] | None:
    """Byte range [start, end) a strided view can read or write. Invariant: exact for any strides (an
    as_strided view onto a shared pool buffer covers only its own prefix), None when it touches no memory."""
    if t.numel() == 0 or t.device.type == "meta":
        return None
    start = t.data_ptr()
    last = sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride()))
    return start, start + (last + 1) * t.element_size()


def iter_tensors(buffers: Any, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """(dotted name, tensor) for every tensor in a buffers dataclass, dict or plain object, nested ones
    flattened as `field.sub` (the way share_buffers() names them). Non-tensor leaves and None are skipped."""
    if isinstance(buffers, torch.Tensor):
        yield prefix or "tensor", buffers
        return
    if dataclasses.is_dataclass(buffers) and not isinstance(buffers, type):
        items = [(f.name, getattr(buffers, f.name, None)) for f in dataclasses.fields(buffers)]
    elif isinstance(buffers, Mapping):
        items = list(buffers.items())
    elif hasattr(buffers, "__dict__"):
        items = list(vars(buffers).items())
    else:
        return
    for name, value in items:
        full = f"{prefix}.{name}" if prefix else str(name)
        if isinstance(value, torch.Tensor):
            yield full, value
        elif value is not None and (dataclasses.is_dataclass(value) or isinstance(value, Mapping)):
            yield from iter_tensors(value, full)


def buffer_rows(buffers: Any) -> list[BufferRow]:
    rows = []
    for name, t in iter_tensors(buffers):
        rows.append(BufferRow(
            name=name, shape=tuple(t.shape), dtype=str(t.dtype).removeprefix("torch."), device=str(t.device),
            nbytes=t.numel() * t.element_size(), span=tensor_span(t),
        ))
    return rows


# ---------------------------------------------------------------- aliasing

@dataclass(frozen=True)
class _Span:
    device: str
    start: int
    end: int
    label: str
    name: str


class AliasRegistry:
    """Byte ranges of every logged runner's buffers, process-wide.

    Invariants: a row is flagged only when its span overlaps a span registered under a *different* label
    (buffers inside one runner are not aliasing across families); the earliest registration wins the flag; a
    label registered again (a recapture) replaces its own spans instead of aliasing onto itself.
    """

    def __init__(self) -> None:
        self._spans: list[_Span] = []

    def check_and_register(self, label: str, rows: list[BufferRow]) -> list[BufferRow]:
        self._spans = [s for s in self._spans if s.label != label]
        out = []
        for row in rows:
            hit = self._first_overlap(row) if row.span is not None else None
            if hit is not None:
                inside = hit.start <= row.span[0] and row.span[1] <= hit.end
                row = dataclasses.replace(row, alias_of=f"{hit.label}.{hit.name}", partial=not inside)
            out.append(row)
        for row in rows:
            if row.span is not None:
                self._spans.append(_Span(row.device, row.span[0], row.span[1], label, row.name))
        return out

    def _first_overlap(self, row: BufferRow) -> _Span | None:
        start, end = row.span
        for s in self._spans:
            if s.device == row.device and start < s.end and s.start < end:
                return s
        return None

    def clear(self) -> None:
        self._spans.clear()


# ---------------------------------------------------------------- pool deltas

@dataclass(frozen=True)
class ShapeDelta:
    label: str
    delta: dict[str, int]  # counter -> bytes after minus before


class PoolDeltaRecorder:
    """Counter deltas around each captured shape.

    Invariant: reading the counters never raises out of `shape()`: a failing stats read is remembered in
    `error` and that shape is left out, while an exception from the capture itself propagates unchanged.
    """

    def __init__(self, stats_fn: StatsFn) -> None:
        self.stats_fn = stats_fn
        self.shapes: list[ShapeDelta] = []
        self.error: str = ""

    def read(self) -> dict[str, int] | None:
        try:
            return {k: int(v) for k, v in self.stats_fn().items()}
        except Exception as exc:
            self.error = self.error or f"{type(exc).__name__}: {exc}"
            return None

    @contextlib.contextmanager
    def shape(self, label: str) -> Iterator[None]:
        before = self.read()
        try:
            yield
        finally:
            after = self.read()
            if before is not None and after is not None:
                self.shapes.append(ShapeDelta(label, diff(before, after)))

    def totals(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.shapes:
            for k, v in s.delta.items():
                out[k] = out.get(k, 0) + v
        return out


# Counters of the graph pool: absent while the pool does not exist yet, and a pool created inside the window (SGLang
# creates its global graph pool inside the capture call, after the hook's first read) held 0 bytes before it.
POOL_KEYS = ("pool", "pool_live")


def diff(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, int]:
    return {k: after[k] - before.get(k, 0) for k in after if k in before or k in POOL_KEYS}


def graph_pool_bytes(pool_id: Any, device: Any = None) -> tuple[int, int]:
    """(reserved, live) bytes of the CUDA caching allocator's segments that belong to graph pool `pool_id`.

    Reads torch.cuda.memory_snapshot(), whose segments carry `segment_pool_id`; this is the pool's own size,
    free of what other streams or pools allocate meanwhile. Costs a walk of every segment: startup only.
    """
    want = tuple(pool_id)
    dev = torch.cuda.current_device() if device is None else torch.device(device).index
    if dev is None:
        dev = torch.cuda.current_device()
    reserved = live = 0
    for seg in torch.cuda.memory_snapshot():
        if seg.get("device") == dev and tuple(seg.get("segment_pool_id", ())) == want:
            reserved += seg["total_size"]
            live += seg["allocated_size"]
    return reserved, live


def cuda_stats_fn(device: Any = None, pool_id: Any = None) -> StatsFn:
    """StatsFn over the CUDA caching allocator: `reserved`/`allocated` for the device, plus `pool`/`pool_live`
    for the graph pool when one is known. `pool_id` may be a callable, read at each call, because SGLang
    creates its global graph pool inside the first capture, after the hook starts recording."""

    def read() -> dict[str, int]:
        out = {
            "reserved": torch.cuda.memory_reserved(device),
            "allocated": torch.cuda.memory_allocated(device),
        }
        pid = pool_id() if callable(pool_id) else pool_id
        if pid is not None:
            out["pool"], out["pool_live"] = graph_pool_bytes(pid, device)
        return out

    return read


# ---------------------------------------------------------------- report

@dataclass(frozen=True)
class BufferTotals:
    own_bytes: int  # device bytes this family allocated itself
    aliased_bytes: int  # device bytes that live in an earlier family's buffers (no new memory)
    host_bytes: int  # CPU-side static buffers (not GPU memory)


def buffer_totals(rows: list[BufferRow]) -> BufferTotals:
    """Invariant: every row is counted exactly once: host rows in host_bytes, device rows in aliased_bytes
    when flagged, else in own_bytes."""
    own = aliased = host = 0
    for r in rows:
        if r.is_host:
            host += r.nbytes
        elif r.alias_of:
            aliased += r.nbytes
        else:
            own += r.nbytes
    return BufferTotals(own, aliased, host)


def _mib(n: int, signed: bool = False, places: int = 2) -> str:
    return f"{n / MIB:+.{places}f}" if signed else f"{n / MIB:.{places}f}"


def format_buffer_table(label: str, rows: list[BufferRow]) -> str:
    head = ("name", "shape", "dtype", "device", "MiB", "aliased onto")
    body = [
        (r.name, "x".join(map(str, r.shape)) or "scalar", r.dtype, r.device, _mib(r.nbytes, places=3),
         (r.alias_of + (" (partial)" if r.partial else "")) if r.alias_of else "")
        for r in rows
    ]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
    line = lambda cells: "  ".join(c.rjust(w) if i == 4 else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    out = [f"[cg_mem] {label}: static buffers ({len(rows)})", "  " + line(head).rstrip()]
    out += ["  " + line(b).rstrip() for b in body]
    return "\n".join(out)


def format_shape_deltas(label: str, shapes: list[ShapeDelta]) -> str:
    if not shapes:
        return f"[cg_mem] {label}: no shape captured through the recorder"
    keys = sorted({k for s in shapes for k in s.delta}, key=lambda k: (_KEY_ORDER.get(k, 99), k))
    out = [f"[cg_mem] {label}: graph memory per captured shape (MiB, after - before)"]
    out.append("  " + "  ".join(["shape".ljust(24)] + [k.rjust(10) for k in keys]))
    for s in shapes:
        out.append("  " + "  ".join([s.label.ljust(24)] + [_mib(s.delta.get(k, 0), True).rjust(10) for k in keys]))
    return "\n".join(out)


_KEY_ORDER = {"pool": 0, "pool_live": 1, "reserved": 2, "allocated": 3}


@dataclass
class FamilyReport:
    """Everything logged for one runner's capture. `whole` is the delta over the entire capture call
    (warm-up and per-runner scratch included), `recorder` the per-shape part of it."""

    label: str
    rows: list[BufferRow]
    recorder: PoolDeltaRecorder
    whole: dict[str, int] = field(default_factory=dict)

    def total_line(self) -> str:
        bt = buffer_totals(self.rows)
        sums = self.recorder.totals()
        n = len(self.recorder.shapes)
        parts = [
            f"[cg_mem] {self.label}: TOTAL static buffers {_mib(bt.own_bytes)} MiB own"
            f" (+{_mib(bt.aliased_bytes)} MiB aliased onto earlier families, {_mib(bt.host_bytes)} MiB host)",
        ]
        growth = sums.get("pool", sums.get("reserved"))
        if growth is not None:
            which = "graph pool" if "pool" in sums else "reserved"
            largest = max(s.delta.get("pool", s.delta.get("reserved", 0)) for s in self.recorder.shapes)
            parts.append(f"{which} {_mib(growth, True)} MiB over {n} shapes (largest shape {_mib(largest, True)})")
        live = sums.get("pool_live", sums.get("allocated"))
        if live is not None:
            parts.append(f"live after capture {_mib(live, True)} MiB")
        if self.whole:
            # The whole call includes warm-up and per-runner scratch that no single shape owns.
            key = "pool" if "pool" in self.whole else "reserved"
            if key in self.whole:
                parts.append(f"whole capture {'graph pool' if key == 'pool' else key} "
                             f"{_mib(self.whole[key], True)} MiB")
        if self.recorder.error:
            parts.append(f"stats unavailable: {self.recorder.error}")
        return "; ".join(parts)

    def format(self) -> str:
        return "\n".join([format_shape_deltas(self.label, self.recorder.shapes), self.total_line()])
