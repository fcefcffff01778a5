"""Scheduler stats logging and scheduler metrics only on attn_cp_rank 0.

Guards seed lines 128-139 (fork commit: under attention CP, attn_tp_size collapses to 1, so attn_tp_rank == 0 on
every CP rank; without `attn_cp_rank == 0` every CP rank logged "Prefill batch" lines and exported scheduler gauges,
inflating summed token throughput by cp_size; upstream PR #38825, 0.5.23 observability/metrics_collector.py
`SchedulerMetricsCollector.init_new`).

Runs the installed classmethod with the runtime-context getters it reads replaced by fakes.
"""

from __future__ import annotations

from types import SimpleNamespace

import regression_mutants as rm

import sglang.srt.observability.metrics_collector as mc
from sglang.srt.observability.metrics_collector import SchedulerMetricsCollector


class _Collector:
    def __init__(self, **kwargs):
        self.kwargs = kwargs


def _context(monkeypatch, *, attn_tp_rank, attn_cp_rank, all_schedulers=False, enable_metrics=True):
    par = SimpleNamespace(attn_tp_rank=attn_tp_rank, attn_cp_rank=attn_cp_rank, pp_rank=0, tp_rank=attn_cp_rank,
                          moe_ep_rank=0, dp_rank=None)
    obs = SimpleNamespace(enable_metrics=enable_metrics, enable_metrics_for_all_schedulers=all_schedulers,
                          kv_events_config=None, extra_metric_labels=None)
    monkeypatch.setattr(mc, "get_parallel", lambda: par)
    monkeypatch.setattr(mc, "get_observability", lambda: obs)
    monkeypatch.setattr(mc, "get_disagg", lambda: SimpleNamespace(enable_pd_role_switch=False,
                                                                  disaggregation_mode="null"))
    monkeypatch.setattr(mc, "get_serving", lambda: SimpleNamespace(served_model_name="m",
                                                                   enable_streaming_session=False))
    monkeypatch.setattr(mc, "resolve_collector_class", lambda role, default: _Collector)
    return SchedulerMetricsCollector.init_new(server_args=None, enable_priority_scheduling=False,
                                              enable_lora=False, enable_hierarchical_cache=False)


def check_cp_rank_gate(monkeypatch) -> None:
    cp0 = _context(monkeypatch, attn_tp_rank=0, attn_cp_rank=0)
    assert cp0.is_stats_logging_rank and cp0.current_scheduler_metrics_enabled, "CP rank 0 must log and export"
    for cp_rank in (1, 3):
        other = _context(monkeypatch, attn_tp_rank=0, attn_cp_rank=cp_rank)
        assert not other.is_stats_logging_rank, f"CP rank {cp_rank} (attn_tp_rank 0) must not log scheduler stats"
        assert not other.current_scheduler_metrics_enabled, f"CP rank {cp_rank} must not export scheduler metrics"
    # The explicit opt-in still exports from every rank, and disabled metrics never export.
    assert _context(monkeypatch, attn_tp_rank=0, attn_cp_rank=2, all_schedulers=True).current_scheduler_metrics_enabled
    assert not _context(monkeypatch, attn_tp_rank=0, attn_cp_rank=0, enable_metrics=False).current_scheduler_metrics_enabled
    assert not _context(monkeypatch, attn_tp_rank=1, attn_cp_rank=0).is_stats_logging_rank


def test_installed_stats_only_on_cp_rank0(monkeypatch):
    check_cp_rank_gate(monkeypatch)


def test_check_detects_tp_only_gate(monkeypatch):
    # The pre-fix gate: attn_tp_rank == 0 alone (0.5.20 metrics_collector.py:1114).
    rm.check_catches_mutant(
        monkeypatch, SchedulerMetricsCollector, "init_new",
        rm.DropConjunct("parallel.attn_cp_rank == 0"),
        check_cp_rank_gate, monkeypatch,
    )
