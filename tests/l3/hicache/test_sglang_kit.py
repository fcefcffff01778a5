"""SGLang's own storage test fixtures (sglang/test/kits/unified_radix_cache, shipped in the wheel) with the L3
backend plugged in through ``dynamic`` by the plugin's flags.

The kit's ``_init_hicache`` only knows the ``file`` backend (and hard-codes kernel I/O); this subclass maps the
kit's ``file`` onto ``--enable-cp-l3 --cp-l3-config <storage_dir>/l3.toml`` and runs direct I/O with
``page_first_direct`` on unpinned host pools, as the kit's own corruption fixtures do. The kit's producer and
consumer caches live in one process at the same time: they share one L3 store (one per config and rank).
"""

import os
import unittest
from unittest import mock

import pytest

from l3kit import ensure_datasets_importable

ensure_datasets_importable()

from sglang.test.kits.unified_radix_cache import fixtures as kit_fixtures  # noqa: E402
from sglang.test.kits.unified_radix_cache.config import CacheConfig  # noqa: E402
from sglang.test.kits.unified_radix_cache.storage import UnifiedRadixCacheStorageFixtures  # noqa: E402


class L3KitFixtures(UnifiedRadixCacheStorageFixtures):
    def setUp(self):
        patcher = mock.patch.object(kit_fixtures, "get_device", return_value="cpu")
        patcher.start()
        self.addCleanup(patcher.stop)

    def _init_hicache(self, cache, *, write_policy="write_through", storage_backend=None, storage_dir=None,
                      prefetch_threshold=None, prefetch_policy="wait_complete", host_memory_mode="cache",
                      storage_extra=None, context_length=None):
        import json

        from sglang.srt.runtime_context import get_parallel
        from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

        from sglang_glm_ext.plugin import flags
        from sglang_glm_ext.l3.config import write_example_config

        if storage_backend != "file":
            return super()._init_hicache(
                cache, write_policy=write_policy, storage_backend=storage_backend, storage_dir=storage_dir,
                prefetch_threshold=prefetch_threshold, prefetch_policy=prefetch_policy,
                host_memory_mode=host_memory_mode, storage_extra=storage_extra, context_length=context_length)
        override = get_parallel().override(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1)
        override.__enter__()
        self.addCleanup(override.__exit__, None, None, None)
        cfg = os.path.join(storage_dir, "l3.toml")
        if not os.path.exists(cfg):
            cfg = write_example_config(storage_dir)
            with open(cfg) as f:
                text = f.read().replace('budget = "1GiB"', 'budget = "16MiB"')  # slabs are preallocated
            with open(cfg, "w") as f:
                f.write(text)
        extra = {"prefetch_threshold": prefetch_threshold} if prefetch_threshold is not None else None
        server_args = ServerArgs(
            model_path="dummy", page_size=self.cfg.page_size, enable_hierarchical_cache=True,
            hicache_io_backend="direct", hicache_mem_layout="page_first_direct",
            hicache_write_policy=write_policy, hicache_storage_prefetch_policy=prefetch_policy,
            hicache_host_memory_mode=host_memory_mode, context_length=context_length,
            hicache_storage_backend_extra_config=json.dumps(extra) if extra else None,
        )
        flags.attach(server_args, flags.validate({"enable_cp_l3": True, "cp_l3_config": cfg}))
        set_global_server_args_for_scheduler(server_args)  # resolves: the plugin's hook picks the backend
        assert server_args.hicache_storage_backend == "dynamic"
        cache.init_hicache(server_args, cache.cache_init_params)
        self.addCleanup(kit_fixtures.drop_hicache_atexit_pin, cache)
        self.addCleanup(cache.release_host_resources)
        self.addCleanup(cache.shutdown)
        cache.write_through_threshold = 1 << 30
        cache.load_back_threshold = 0
        cc = cache.cache_controller
        cc.prefetch_capacity_limit = max(cc.prefetch_capacity_limit, cc.mem_pool_host.size)
        self.addCleanup(cc._stop_storage_threads)


@pytest.mark.usefixtures("standins", "sglang_state")  # the kit publishes server args
class TestL3ThroughSGLangStorageKit(L3KitFixtures, unittest.TestCase):
    cfg = CacheConfig(page_size=64, num_layers=4, kv_size=1024, max_context_len=1024)

    def test_kit_producer_to_consumer_prefetch_is_byte_exact(self):
        from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle

        storage_dir = self._make_storage_dir()
        seq = self._make_seq(1, 4)
        expected = self._l3_produce(storage_dir, seq, marker=3)
        cons, cons_alloc, _ = self._l3_consumer(storage_dir)
        backend = cons.cache_controller.storage_backend
        self.assertEqual(type(backend).__name__, "L3HiCacheStorage")
        self.assertEqual(backend.namespace.kv_dtype, "bfloat16")
        from sglang_glm_ext.l3.engine.store import L3Store

        # producer and consumer controllers share one store, no lock error
        shared = L3Store.find_open(backend.config, backend.rank)
        self.assertIs(shared, backend.store.shared)
        self.assertEqual(shared.refs, 2)
        hashes = self._all_page_hashes_for(cons, seq)
        self.assertEqual(self._storage_exists_count(cons, hashes), 4)  # the kit's own ground-truth query
        handle = CacheRequestHandle("kit-consumer", 0)
        self._consume_prefetch(cons, seq, handle)
        self.assertEqual(cons.pop_prefetch_loaded_tokens(handle), len(seq))
        node = kit_fixtures.match_prefix(cons, seq).last_host_node
        device = self._load_back_node(cons, node)
        self.assertEqual(len(device), len(seq))
        got = self._snapshot_full_kv(cons_alloc, device)
        for a, b in zip(got, expected):
            self.assertTrue(bool((a == b).all()))

    def test_kit_consumer_misses_what_was_never_produced(self):
        from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle

        storage_dir = self._make_storage_dir()
        self._l3_produce(storage_dir, self._make_seq(1, 2))
        cons, _, _ = self._l3_consumer(storage_dir)
        other = self._make_seq(50_000, 2)
        self.assertEqual(self._storage_exists_count(cons, self._all_page_hashes_for(cons, other)), 0)
        handle = CacheRequestHandle("kit-miss", 0)
        self._consume_prefetch(cons, other, handle)
        self.assertEqual(cons.pop_prefetch_loaded_tokens(handle), 0)

    def _all_page_hashes_for(self, cache, seq):
        from sglang.srt.mem_cache.utils import get_storage_hash_str

        return get_storage_hash_str(seq, None, page_size=self.cfg.page_size)
