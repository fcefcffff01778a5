"""host_dedup's host budget (patches host_dedup.host_budget / host_dedup.auto_size): SGLang's host-memory guard
(``pool_host/base.py`` ``host_memory_budget_bytes``, what every host pool's allocation and the auto-size budget ask)
shares the host's free RAM among the ranks that pin host pools: under dedup one source per group, not every rank.

SGLang's own functions run here; the host is made an 8-rank node with 200 GiB available (SGLang's reserve of 10 GiB
taken off), and the hooks are wrapped around SGLang's functions as the hook registry wraps them."""

import contextlib
import functools

import pytest

from sglang_glm_ext.host_dedup import hooks
from sglang_glm_ext.host_dedup.plan import Facts, decide
from sglang_glm_ext.patching.ledger import resolve_original

GiB = 1 << 30
FREE = 200 * GiB


@pytest.fixture
def node8(monkeypatch):
    """SGLang's pool_host.base on an 8-rank, one-node launch with 200 GiB available, ranks_per_host hooked."""
    import torch
    from types import SimpleNamespace

    from sglang.srt.mem_cache.pool_host import base

    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(base, "get_parallel", lambda: SimpleNamespace(launch_world_size=8, nnodes=1))
    monkeypatch.setattr(base, "available_host_memory_bytes", lambda **kw: FREE)
    # SGLang's own function, also where the plugin registered in this process and its hook already wraps it
    original = resolve_original("sglang.srt.mem_cache.pool_host.base.ranks_per_host")
    monkeypatch.setattr(base, "ranks_per_host", functools.partial(hooks.hook_ranks_per_host, original))
    return base


def _plan(mode="on", **kw):
    return decide(Facts(mode=mode, tp_size=8, attn_cp_size=8, storage="l3", **kw))


def _params():
    from types import SimpleNamespace

    return SimpleNamespace(token_to_kv_pool_allocator=SimpleNamespace(get_kvcache=lambda: "device pool"))


def _auto_size(base, seen):
    """Stands in for SGLang's auto_size_hicache (a context manager): what its budget and a pool built inside get."""

    @contextlib.contextmanager
    def auto_size(params, draft_plan, *, enabled):
        seen["auto_budget"] = base.host_memory_budget_bytes(auto_size=True)
        yield
    return auto_size


def test_sglangs_guard_divides_free_ram_by_every_rank_on_the_host_without_dedup(node8):
    assert node8.ranks_per_host() == 8
    assert node8.host_memory_budget_bytes() == (FREE - 10 * GiB) // 8


@pytest.mark.parametrize("rank", [0, 3])
def test_under_dedup_the_pools_of_a_group_count_one_holder_on_the_host(node8, monkeypatch, rank):
    plan = decide(Facts(mode="on", tp_rank=rank, tp_size=8, attn_cp_size=8, storage="l3"))
    assert plan.on and len(plan.group) == 8
    monkeypatch.setattr(hooks, "_device_plan", lambda dev: plan)
    seen = {}
    with hooks.hook_auto_size(_auto_size(node8, seen), _params(), None, enabled=True):
        seen["pool_budget"] = node8.host_memory_budget_bytes(48 * GiB)  # a pool's guard inside the context
        seen["ranks"] = node8.ranks_per_host()
    # source and peer alike (auto-sizing's world MIN keeps their slot counts equal); only the source pins
    assert seen == {"auto_budget": FREE - 10 * GiB, "pool_budget": FREE - 10 * GiB, "ranks": 1}
    assert node8.host_memory_budget_bytes() == (FREE - 10 * GiB) // 8  # outside the context: SGLang's own


def test_two_attention_dp_groups_on_a_node_share_its_ram_between_their_two_sources(node8, monkeypatch):
    plan = decide(Facts(mode="on", tp_rank=5, tp_size=8, attn_cp_size=4, attn_dp_size=2, storage="l3"))
    assert plan.on and plan.group == (4, 5, 6, 7)
    monkeypatch.setattr(hooks, "_device_plan", lambda dev: plan)
    seen = {}
    with hooks.hook_auto_size(_auto_size(node8, seen), _params(), None, enabled=True):
        assert node8.ranks_per_host() == 2
    assert seen["auto_budget"] == (FREE - 10 * GiB) // 2


@pytest.mark.parametrize("plan", [_plan("off"), _plan("auto"), _plan("on", speculative=True)])
def test_where_dedup_does_not_run_every_rank_keeps_its_own_share(node8, monkeypatch, plan):
    monkeypatch.setattr(hooks, "_device_plan", lambda dev: plan)
    seen = {}
    with hooks.hook_auto_size(_auto_size(node8, seen), _params(), None, enabled=True):
        assert node8.ranks_per_host() == 8
    assert seen["auto_budget"] == (FREE - 10 * GiB) // 8


def test_the_scope_ends_with_the_context_also_when_building_a_pool_fails(node8, monkeypatch):
    monkeypatch.setattr(hooks, "_device_plan", lambda dev: _plan())
    with pytest.raises(ValueError, match="Not enough host memory"):
        with hooks.hook_auto_size(_auto_size(node8, {}), _params(), None, enabled=True):
            raise ValueError("Not enough host memory available")
    assert node8.ranks_per_host() == 8


def test_no_readable_device_pool_is_sglangs_own_sizing(node8):
    from types import SimpleNamespace

    seen = {}
    params = SimpleNamespace(token_to_kv_pool_allocator=None)  # get_kvcache() cannot be reached
    with hooks.hook_auto_size(_auto_size(node8, seen), params, None, enabled=True):
        assert node8.ranks_per_host() == 8
    assert seen["auto_budget"] == (FREE - 10 * GiB) // 8
