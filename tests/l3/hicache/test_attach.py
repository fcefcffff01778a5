"""One store per (config, rank) per process, shared and refcounted; pages visible between spill and durability;
the extra config SGLang's dynamic factory gets."""

import json
import threading
import time

import pytest

from sglang_glm_ext.l3.config import L3Config
from sglang_glm_ext.l3.format import Namespace, PayloadKind
from sglang_glm_ext.l3.hicache import attach

NS = Namespace(model="m", kv_dtype="float8_e4m3fn", layout="page_first", page_size=64, layer_start=0,
               layer_end=4, shard="replicated-pp0of1")
PB = {PayloadKind.TARGET_KV: 16384}


class _FakeStore:
    def __init__(self, config):
        self.config = config
        self.closed = 0

    def close(self, timeout=30.0):
        self.closed += 1

    def stats(self):
        return {"inflight": 0}

    def exists(self, kind, keys):
        return 0


def test_second_attach_shares_the_store_and_the_last_release_closes_it(l3_config):
    reg = attach.StoreRegistry()
    cfg = L3Config.load(l3_config)
    opened = []

    def opener():
        opened.append(_FakeStore(cfg))
        return opened[-1]

    a = reg.acquire(cfg, 0, NS, PB, opener, holder="a")
    b = reg.acquire(L3Config.load(l3_config), 0, NS, PB, opener, holder="b")
    assert a is b and len(opened) == 1 and a.refs == 2
    assert reg.release(a, holder="a") is False and opened[0].closed == 0
    assert reg.release(b, holder="b") is True and opened[0].closed == 1
    assert reg.release(b) is False  # a stray release is harmless
    c = reg.acquire(cfg, 0, NS, PB, opener)  # re-attach after the last detach opens afresh
    assert len(opened) == 2 and c.refs == 1


def test_other_rank_gets_its_own_store(l3_config):
    reg = attach.StoreRegistry()
    cfg = L3Config.load(l3_config)
    a = reg.acquire(cfg, 0, NS, PB, lambda: _FakeStore(cfg))
    b = reg.acquire(cfg, 1, NS, PB, lambda: _FakeStore(cfg))
    assert a is not b


def test_attach_with_another_format_is_refused(l3_config):
    reg = attach.StoreRegistry()
    cfg = L3Config.load(l3_config)
    reg.acquire(cfg, 0, NS, PB, lambda: _FakeStore(cfg))
    other = Namespace(model="m", kv_dtype="float8_e5m2", layout="page_first", page_size=64, layer_start=0,
                      layer_end=4, shard="replicated-pp0of1")
    with pytest.raises(attach.AttachError, match="another page format"):
        reg.acquire(cfg, 0, other, PB, lambda: _FakeStore(cfg))
    with pytest.raises(attach.AttachError, match="another page format"):
        reg.acquire(cfg, 0, NS, {PayloadKind.TARGET_KV: 8192}, lambda: _FakeStore(cfg))


def test_pending_pages_count_until_the_store_has_drained():
    state = {"inflight": 1, "durable": set()}
    pend = attach.PendingPages(lambda: state["inflight"], lambda kind, keys: int(keys[0] in state["durable"]),
                               max_wait_s=2.0)
    pend.add("kv", [b"a", b"b"], [True, False])
    assert pend.contains("kv", b"a") and not pend.contains("kv", b"b") and len(pend) == 1
    pend.prune()
    assert pend.contains("kv", b"a")  # still in flight
    state["inflight"] = 0
    pend.prune()
    assert not pend.contains("kv", b"a") and len(pend) == 0


def test_wait_durable_returns_when_the_page_lands_and_is_bounded_otherwise():
    state = {"inflight": 1, "durable": set()}
    pend = attach.PendingPages(lambda: state["inflight"], lambda kind, keys: int(keys[0] in state["durable"]),
                               max_wait_s=0.3)
    pend.add("kv", [b"a", b"b"], [True, True])
    threading.Timer(0.05, lambda: state["durable"].add(b"a")).start()
    assert pend.wait_durable("kv", b"a") is True
    assert pend.wait_durable("kv", b"b") is False  # never lands: gives up after max_wait_s


def test_extra_config_names_the_backend_and_selects_zero_copy(l3_config):
    extra = attach.extra_config(l3_config, {"prefetch_threshold": 64})
    assert extra["backend_name"] == attach.BACKEND_NAME and extra["interface_v1"] == 1
    assert extra["module_path"] == "sglang_glm_ext.l3.hicache.backend" and extra["class_name"] == "L3HiCacheStorage"
    assert extra["prefetch_threshold"] == 64 and extra["l3_config"] == l3_config
    assert attach.parse_extra_config(json.loads(json.dumps(extra))) == extra
    with pytest.raises(ValueError, match="cannot be combined"):
        attach.extra_config(l3_config, {"file_storage_path": "/tmp"})


def test_a_config_edited_after_launch_is_refused_at_attach(l3_config):
    extra = attach.extra_config(l3_config)
    with open(l3_config, "a") as f:
        f.write("\n# edited\n")
    with pytest.raises(attach.AttachError, match="changed after launch"):
        attach.parse_extra_config(extra)
    with pytest.raises(attach.AttachError, match="without the plugin's extra config"):
        attach.parse_extra_config({"backend_name": "x"})


def test_pending_pages_stay_bounded_under_traffic_that_never_idles():
    durable = set()
    pend = attach.PendingPages(lambda: 1, lambda kind, keys: next((i for i, k in enumerate(keys) if k not in durable),
                                                                   len(keys)), max_age_s=3600)
    keys = [i.to_bytes(4, "little") for i in range(1000)]
    pend.add("kv", keys, [True] * len(keys))
    durable.update(keys[:900])  # the store finished the oldest 900; it is never idle (inflight stays 1)
    for _ in range(5):
        pend.prune()
    assert len(pend) == 100 and pend.contains("kv", keys[950]) and not pend.contains("kv", keys[0])


def test_pending_pages_forget_a_dropped_write_after_max_age():
    pend = attach.PendingPages(lambda: 1, lambda kind, keys: 0, max_age_s=0.0)
    pend.add("kv", [b"lost"], [True])
    time.sleep(0.01)
    pend.prune()
    assert len(pend) == 0
