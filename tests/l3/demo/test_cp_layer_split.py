"""DSA cache layer split across 2-3 gloo processes: each attention-CP rank holds its own layers of every page
(SGLang's ``LayerSplitDSATokenToKVPool`` and the host pools its assembler makes of it), SGLang's real
``UnifiedRadixCache`` + ``HybridCacheController`` run their hit and completion MINs over the gloo CP group, and the
L3 backend serves each rank's part under a namespace naming it. Driver: ``sglang_glm_ext/l3/demo/cp_layer_split.py``
(run by ``cp_ranks.py``). Every multi-process run is bounded: a rank that does not finish in time fails the test (all
ranks are killed), it is never skipped."""

import signal
import time

import pytest

from .test_cp_ranks import (PS, RUN_TIMEOUT, _config, _kill_mid_write, _results, _spawn,  # noqa: F401 - a fixture
                             zygote)

pytestmark = pytest.mark.slow

LAYERS = 5  # 3 + 2 layers over 2 ranks, 2 + 2 + 1 over 3: uneven parts, and a rank with a padding host layer


def _ranges(world):
    from sglang.srt.layers.cp.utils import get_layer_shard_range

    return [list(get_layer_shard_range(r, world, LAYERS)) for r in range(world)]


@pytest.mark.parametrize("world", [2, 3])
def test_every_rank_reloads_its_own_layers_and_a_missing_or_corrupt_part_cuts_every_rank_alike(zygote, tmp_path,
                                                                                               world):
    pages = 8
    procs, out = _spawn(zygote, tmp_path, "hits", world, _config(tmp_path, world), "lsplit_hits", layers=LAYERS,
                        pages=pages, lag=3, corrupt_page=5, keep=2)
    res = _results(procs, out, time.monotonic() + RUN_TIMEOUT)
    ranges = _ranges(world)
    assert len({res[r]["digest"] for r in range(world)}) == world  # one namespace per part
    for r in range(world):
        got = res[r]
        assert got["cp_rank"] == r and got["cp_size"] == world
        assert got["shard"] == f"replicated-pp0of1-lsplit{r}of{world}" and got["layers"] == ranges[r]
        assert got["writers"] == [r]  # attention TP 1: each part has one holder, which writes it
        # the attach checked its part group against the groups SGLang's controller really reduces over
        assert got["sync_groups_hook"] == got["sync_groups_sglang"] == got["sync_groups_recomputed"] \
            == [list(range(world))]
        assert got["durable_seen"] == pages
        a = got["after_write"]
        assert a["spill_accepted"] == 2 * pages and a["not_owned"] == 0  # its KV and indexer part of every page
        assert got["loaded"] == pages * PS and got["bytes_ok"]  # its own layers, byte-exact
        assert got["loaded_lag"] == 3 * PS and got["bytes_ok_lag"]  # rank 1's lagging view: the same prefix
        assert got["loaded_corrupt"] == 5 * PS and got["bytes_ok_corrupt"]  # rank 1's page 5 rotted: pages 0-4
        assert got["loaded_missing"] == 2 * PS and got["bytes_ok_missing"]  # rank 1's part of pages 2.. missing
        assert got["durable_t2"] == (2 if r == 1 else pages)
    assert res[1]["final"]["verify_failures"] == 1
    assert all(res[r]["final"]["verify_failures"] == 0 for r in range(world) if r != 1)


def test_a_sigkilled_rank_loses_nothing_acknowledged_and_another_split_is_a_clean_miss(zygote, tmp_path):
    world, victim = 3, 1
    # 64 MiB over 3 ranks: the victim's bounded write loop stays below its GC watermark (GC may drop cold pages by
    # design; this test is about a crash) and is long enough that a kill after its 2nd batch lands inside it
    cfg = _config(tmp_path, world, budget="64MiB", cold_start="load")
    procs, out = _spawn(zygote, tmp_path, "crash", world, cfg, "lsplit_crash_write", victim=victim, layers=LAYERS)
    deadline = time.monotonic() + RUN_TIMEOUT
    n_acked = _kill_mid_write(procs, out, victim, 8, deadline)
    res = _results(procs, out, deadline, skip=(victim,))
    assert procs[victim].returncode == -signal.SIGKILL
    # its bounded loop writes 4 keys a batch (victim_batches: "<batches> of <slots> slots"): fewer were acknowledged,
    # so the kill came while it was still writing, not after its loop ended
    batches = int((out / "victim_batches").read_text().split()[0])
    assert 8 <= n_acked < 4 * batches, (n_acked, batches)
    for r, got in res.items():
        assert got["durable_seen"] == 8
        assert got["victim_acked_seen_by_other_part"] == 0  # another part's pages are never found here
    digests = {r: got["digest"] for r, got in res.items()}

    # restart the world with cold_start = load: the victim keeps every page it acknowledged, every rank its part
    procs, out2 = _spawn(zygote, tmp_path, "restart", world, cfg, "lsplit_crash_reload", acked_dir=str(out), layers=LAYERS)
    res = _results(procs, out2, time.monotonic() + RUN_TIMEOUT)
    assert {r: res[r]["digest"] for r in digests} == digests  # the same parts, the same namespaces
    assert res[victim]["victim_acked"] == res[victim]["victim_acked_seen"] == n_acked > 0
    assert res[victim]["cold_start_loaded_pages"] >= n_acked
    for r, got in res.items():
        assert got["loaded"] == 8 * PS and got["bytes_ok"]  # SGLang's prefetch hits every page on every rank

    # the same disks under another split (2 ranks): other parts, other namespaces: a clean miss, never bytes
    procs, out3 = _spawn(zygote, tmp_path, "other", 2, cfg, "lsplit_other_split", layers=LAYERS)
    res2 = _results(procs, out3, time.monotonic() + RUN_TIMEOUT)
    for r, got in res2.items():
        assert got["shard"] == f"replicated-pp0of1-lsplit{r}of2" and got["digest"] not in digests.values()
        assert got["cold_start_other_namespace_pages"] > 0  # the 3-way split's pages are kept, not served
        assert got["loaded"] == 0 and got["reload_hits"] == 0 and got["errors"] == 0


@pytest.mark.gpu(reason="proves layer split under SGLang's real HiCache kernels (kernel I/O, layer_first: the one "
                        "layout SGLang 0.5.23 writes a layer-sharded DSA indexer back in; page_first raised on the "
                        "H200 and is refused at launch) with pinned host pools: 2 CP ranks on one GPU, gloo MINs, every "
                        "rank reloads its own layers byte-exact, a corrupt or missing part cuts both")
@pytest.mark.parametrize("layout", ["layer_first"])
def test_layer_split_round_trips_through_sglangs_gpu_kernels(zygote, tmp_path, layout):
    world, pages = 2, 8
    procs, out = _spawn(zygote, tmp_path, "gpu", world, _config(tmp_path, world), "lsplit_hits", layers=LAYERS, pages=pages,
                        lag=3, corrupt_page=5, keep=2, device="cuda", layout=layout, io_backend="kernel")
    res = _results(procs, out, time.monotonic() + RUN_TIMEOUT)
    for r in range(world):
        got = res[r]
        assert got["loaded"] == pages * PS and got["bytes_ok"]
        assert got["loaded_lag"] == 3 * PS and got["bytes_ok_lag"]
        assert got["loaded_corrupt"] == 5 * PS and got["bytes_ok_corrupt"]
        assert got["loaded_missing"] == 2 * PS and got["bytes_ok_missing"]
