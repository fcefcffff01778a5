"""The thin SGLang side of cg_mem: two AROUND hooks on DecodeCudaGraphRunner (declared in patches.py).

Why these targets (SGLang 0.5.23):
- `DecodeCudaGraphRunner.capture` runs inside every decode-graph runner's __init__, after share_buffers(), and
  neither EAGLEDraftCudaGraphRunner nor EAGLEDraftExtendCudaGraphRunner overrides it, so one hook sees all four
  families with their final (possibly aliased) buffers.
- Both EAGLE runners override `capture_one_shape`, so a class-level hook on the base would miss them. The
  capture hook instead sets an instance attribute `capture_one_shape` for the duration of the capture (the loop
  in `_capture_one_stream` calls `self.capture_one_shape(...)`, which finds the instance attribute first) and
  removes it afterwards: per-shape recording covers every subclass without patching each one.
- `_post_process_after_profile` dumps the memory snapshot to one fixed file name; the hook points that one
  call at `cuda_graph_mem_<family>.pickle`.

Cost when off: `capture` checks one cached bool and calls the original; nothing else is read or set.
Logging never breaks a capture: any failure in our code is logged once and the capture carries on untouched.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import torch

from . import attribution as attr
from .feature import FEATURE

logger = logging.getLogger("sglang_glm_ext")

_ACTIVE: bool | None = None
_WARNED = False
LABELS = attr.Labels()
ALIASES = attr.AliasRegistry()
_LABEL_ATTR = "_glm_ext_cg_label"
_MISSING = object()


def active() -> bool:
    """Whether cg_mem is on for this process; read once (server args are final before the first capture)."""
    global _ACTIVE
    if _ACTIVE is None:
        try:
            _ACTIVE = FEATURE.is_active()
        except Exception as exc:  # a bad SGLANG_LOG_CG_BUFFERS value must not stop model loading
            _warn_once("cannot read the cg_mem switch; attribution is off", exc)
            _ACTIVE = False
    return _ACTIVE


def reset_for_tests() -> None:
    global _ACTIVE, _WARNED, LABELS
    _ACTIVE, _WARNED = None, False
    LABELS = attr.Labels()
    ALIASES.clear()


def _warn_once(what: str, exc: BaseException) -> None:
    global _WARNED
    if not _WARNED:
        _WARNED = True
        logger.warning("sglang-glm-ext cg_mem: %s (capture continues): %s: %s", what, type(exc).__name__, exc,
                       exc_info=True)


def _tp_rank() -> int:
    try:
        from sglang.srt.runtime_context import get_parallel

        return int(get_parallel().tp_rank)
    except Exception:
        # The runtime context raises on an unpublished rank (single-process tools, tests): behave as rank 0.
        return 0


def label_for(runner: Any) -> str:
    """The runner's family label, assigned once per runner so its log lines and its pickle agree."""
    label = runner.__dict__.get(_LABEL_ATTR)
    if label is None:
        model_runner = getattr(runner, "model_runner", None)
        family = attr.family_name(
            type(runner).__name__, getattr(runner, "capture_forward_mode", None),
            is_draft_worker=bool(getattr(model_runner, "is_draft_worker", False)),
        )
        label = LABELS.assign(family)
        runner.__dict__[_LABEL_ATTR] = label
    return label


def _graph_pool_id() -> Any:
    from sglang.srt.model_executor.runner_utils.pool import get_global_graph_memory_pool

    return get_global_graph_memory_pool()


def _stats_fn(runner: Any) -> attr.StatsFn | None:
    """Counter reader for this runner's device; None where there is no CUDA (then only the table is logged).
    Tests replace this function to drive the recorder on a CPU."""
    if not torch.cuda.is_available():
        return None
    return attr.cuda_stats_fn(getattr(runner, "device", None), _graph_pool_id)


# ---------------------------------------------------------------- capture

class _Session:
    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self.label = label_for(runner)
        rows = attr.buffer_rows(getattr(runner, "buffers", None))
        rows = ALIASES.check_and_register(self.label, rows)
        stats = _stats_fn(runner)
        self.report = attr.FamilyReport(self.label, rows, attr.PoolDeltaRecorder(stats or (lambda: {})))
        self.has_stats = stats is not None
        self.before = self.report.recorder.read() if self.has_stats else None
        self.prev = runner.__dict__.get("capture_one_shape", _MISSING)
        self.installed = False
        logger.info("%s", attr.format_buffer_table(self.label, rows))
        if self.has_stats:
            self._install()

    def _install(self) -> None:
        inner: Callable = self.runner.capture_one_shape  # bound method of the runner's own class (or a prior wrapper)
        recorder = self.report.recorder

        def capture_one_shape(size, *args, **kwargs):
            # Mirrors the loop's positional call: (size, forward, stream_idx, variant_label, attention_variant).
            extra = list(args[1:4]) + [None] * (3 - len(args[1:4]))
            stream_idx = kwargs.get("stream_idx", extra[0])
            variant = kwargs.get("variant_label", extra[1])
            attn = kwargs.get("attention_variant", extra[2])
            try:
                label = attr.shape_label(size, stream_idx, variant, attn)
            except Exception:
                label = f"bs={size}"
            with recorder.shape(label):
                return inner(size, *args, **kwargs)

        self.runner.capture_one_shape = capture_one_shape
        self.installed = True

    def restore(self) -> None:
        """Take the per-shape wrapper off the runner: replay and later recaptures see the class method."""
        if self.installed:
            self.installed = False
            if self.prev is _MISSING:
                self.runner.__dict__.pop("capture_one_shape", None)
            else:
                self.runner.capture_one_shape = self.prev

    def finish(self) -> None:
        self.restore()
        if self.before is not None:
            after = self.report.recorder.read()
            if after is not None:
                self.report.whole = attr.diff(self.before, after)
        logger.info("%s", self.report.format() if self.has_stats else self.report.total_line())


def hook_capture(original: Callable, self: Any, *args, **kwargs):
    """AROUND DecodeCudaGraphRunner.capture. Invariant: `original` runs exactly once with the caller's
    arguments, and its result or exception reaches the caller unchanged, whatever our code does."""
    if not active():
        return original(self, *args, **kwargs)
    if _tp_rank() != 0:
        return original(self, *args, **kwargs)
    try:
        session = _Session(self)
    except Exception as exc:
        _warn_once("buffer attribution failed", exc)
        return original(self, *args, **kwargs)
    try:
        return original(self, *args, **kwargs)
    finally:
        try:
            session.finish()
        except Exception as exc:
            _warn_once("pool attribution failed", exc)
            session.restore()


# ---------------------------------------------------------------- profile snapshot

def hook_post_process_after_profile(original: Callable, self: Any, prof_context: Any, *args, **kwargs):
    """AROUND DecodeCudaGraphRunner._post_process_after_profile: the one snapshot dump inside goes to
    cuda_graph_mem_<family>.pickle. Invariant: torch.cuda.memory._dump_snapshot is restored on every exit.

    Not gated by cg_mem: it only runs under --enable-profile-cuda-graph, and there SGLang's fixed file name
    makes every runner overwrite the previous one's snapshot (seed 152-162 fixed it unconditionally too).
    """
    try:
        rank = _tp_rank()
        filename = attr.pickle_filename(label_for(self), rank)
    except Exception as exc:
        _warn_once("cannot name the per-family snapshot; SGLang's file name is kept", exc)
        return original(self, prof_context, *args, **kwargs)
    memory = torch.cuda.memory
    real_dump = memory._dump_snapshot

    def dump_snapshot(filename_ignored: str = attr.LEGACY_PICKLE, *a, **kw):
        return real_dump(filename, *a, **kw)

    memory._dump_snapshot = dump_snapshot
    try:
        result = original(self, prof_context, *args, **kwargs)
    finally:
        memory._dump_snapshot = real_dump
    if rank == 0:
        logger.info("[cg_mem] %s: CUDA-graph memory snapshot saved to %s (not %s, as SGLang's message says)",
                    label_for(self), filename, attr.LEGACY_PICKLE)
    return result
