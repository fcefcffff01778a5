"""The store's counters the metrics read (l3/engine/counters.py, ``stats()``): bytes beside pages, reload inflight, and
monotonic across ``clear``."""

import threading

import numpy as np

import l3kit
from l3kit import K, key
from sglang_glm_ext.l3.disk.format import slot_bytes_for
from sglang_glm_ext.l3.disk.host_layout import PageLayout

PB = 2 * 4096 + 300
SLOT = slot_bytes_for(PB)
NS = l3kit.NS  # the store fixture's namespace
page = l3kit.pages_of(PB)


def cfg(tmp_path):
    return l3kit.config(tmp_path, budget=32 * SLOT, map_size=64 * 2**20,
                        queues={"staging_bytes": 16 * SLOT, "max_inflight": 12, "write_batch_pages": 4,
                                "io_threads": 2, "reload_threads": 2})


def test_bytes_follow_pages_and_clear_resets_no_counter(store):
    assert all(store.spill(K, [key(i) for i in range(5)], [page(i) for i in range(5)]))
    assert store.flush(30)
    st = store.stats()
    assert st["spilled"] == 5 and st["spilled_bytes"] == 5 * PB
    assert st["max_inflight"] == 12 and st["inflight"] == 0
    dsts = [np.zeros(PB, np.uint8) for _ in range(6)]
    assert store.reload_into(K, [key(i) for i in range(6)], dsts) == [True] * 5 + [False]
    st = store.stats()
    assert st["reload_hits"] == 5 and st["reload_bytes"] == 5 * PB and st["reload_misses"] == 1
    before = {k: v for k, v in st.items() if k.endswith(("_bytes", "_hits", "_misses")) or k == "spilled"}
    assert store.clear()
    after = store.stats()
    assert after["slots"]["target_kv"]["used"] == 0
    assert {k: after[k] for k in before if k.startswith(("spilled", "reload_"))} == \
        {k: v for k, v in before.items() if k.startswith(("spilled", "reload_"))}


class _BlockingLayout:
    """A host layout whose read path waits: a reload is provably in flight while it waits. A durable page is read
    straight into the layout's spans (page_spans, issue 13), a staged one scattered from staging: both wait."""

    def __init__(self, inner: PageLayout):
        self.inner, self.num_pages, self.page_bytes = inner, inner.num_pages, inner.page_bytes
        self.entered, self.release = threading.Event(), threading.Event()

    def _wait(self):
        self.entered.set()
        assert self.release.wait(10)

    def page_spans(self, *args):
        self._wait()
        return self.inner.page_spans(*args)

    def read_plan(self, *args):
        return self.inner.read_plan(*args)

    def scatter_from(self, *args):
        self._wait()
        return self.inner.scatter_from(*args)

    def gather_into(self, *args):
        return self.inner.gather_into(*args)


def test_reload_inflight_counts_pages_inside_a_reload_call_and_returns_to_zero(store):
    host = np.zeros(PB * 3, np.uint8)
    lay = PageLayout.layer_first(host, n_layers=1, slice_bytes=PB, num_pages=3)
    assert all(store.spill(K, [key(i) for i in range(3)], [page(i) for i in range(3)]))
    assert store.flush(30)
    blocking = _BlockingLayout(lay)
    got = {}
    t = threading.Thread(target=lambda: got.setdefault("ok", store.reload_into_layout(
        K, [key(i) for i in range(3)], blocking, [0, 1, 2])))
    t.start()
    try:
        assert blocking.entered.wait(60)
        assert store.stats()["reload_inflight"] == 3
    finally:
        blocking.release.set()
        t.join(60)
    assert not t.is_alive(), "hang guard: the reload did not return in 60 s after its release"
    assert got["ok"] == [True] * 3
    assert store.stats()["reload_inflight"] == 0
    # A call that fails part-way (a non-iterable key list) still leaves the gauge at zero.
    assert store.reload_into(K, None, []) == []
    assert store.stats()["reload_inflight"] == 0
