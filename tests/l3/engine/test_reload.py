"""Reloads read straight into the caller's memory (issue 13): byte-exact into page-first and layer-first host
buffers at aligned and unaligned addresses, with every neighbour byte of the destination untouched (guard bytes),
also when the page is a miss; corrupt payload tails and headers are misses; version mismatches as the upgrade
policy says. Real files, real O_DIRECT where the file system takes it."""

import mmap
import os
import struct

import numpy as np
import pytest

import l3kit
from l3kit import K
from sglang_glm_ext.l3.disk.format import HEADER_SIZE, slot_bytes_for
from sglang_glm_ext.l3.disk.host_layout import PageLayout
from sglang_glm_ext.l3.engine.store import L3Store

NS = l3kit.namespace(kv_dtype="fp8", layout="layer_first", layer_end=3)
CHUNK = 64 * 656  # GLM-5's layer chunk: 41,984 B, 512 B-aligned, not 4 KiB-aligned
GUARD = 0xA5


def key(i, salt="r"):
    return l3kit.key(i, salt)


def payload(i, nbytes, salt="r"):
    return l3kit.page(i, salt, nbytes=nbytes)


def open_store(tmp_path, pb, slots=16):
    cfg = l3kit.config(tmp_path, budget=slots * slot_bytes_for(pb), deployment="rl",
                       queues={"staging_bytes": 8 * slot_bytes_for(pb), "io_threads": 2, "reload_threads": 2})
    return L3Store.open(cfg, rank=0, namespace=NS, page_bytes={K: pb})


def spill(s, idxs, pb):
    l3kit.spill_durable(s, idxs, "r", nbytes=pb)


def guarded(nbytes):
    """A page-aligned array of guard bytes (its mapping lives as long as the array)."""
    arr = np.frombuffer(mmap.mmap(-1, nbytes), np.uint8)
    arr[:] = GUARD
    return arr


def slot_of(s, i):
    return s.diagnostics().entry(K, key(i)).slot


def poke(s, offset, data):
    with open(s.slab(K).path, "r+b") as f:
        f.seek(offset)
        f.write(data)


# ---------------------------------------------------------------------- page-first
@pytest.mark.parametrize("pb", [3 * CHUNK, 3 * CHUNK + 100], ids=["block-multiple", "partial-tail"])
def test_page_first_reloads_are_exact_at_any_address_and_never_touch_a_neighbour(tmp_path, pb):
    s = open_store(tmp_path, pb)
    try:
        spill(s, range(3), pb)
        arr = guarded(pb + 3 * 4096)
        for off in (0, 512, 2048, 4096, 1, 100, 513):
            arr[:] = GUARD
            dst = arr[off:off + pb]
            assert s.reload_into(K, [key(1)], [dst]) == [True], off
            assert np.array_equal(dst, payload(1, pb)), off
            assert (arr[:off] == GUARD).all() and (arr[off + pb:] == GUARD).all(), off
        io = s.diagnostics().io_counters()
        align = s.diagnostics().alignment()
        if align and all("mem 512 B" in a or "mem 4 B" in a for a in align.values()):
            # 512 B memory alignment (ext4 on virtio here, NVMe reports 4 B): the aligned offsets went straight in
            assert io["direct_bytes"] >= 4 * (pb // 512 * 512 - 4096)
        assert io["span_reads"] == 7
    finally:
        s.close()


def test_an_oversized_destination_gets_the_page_in_its_first_bytes_only(tmp_path):
    pb = 3 * CHUNK
    s = open_store(tmp_path, pb)
    try:
        spill(s, [0], pb)
        arr = guarded(pb + 8192)
        assert s.reload_into(K, [key(0)], [arr]) == [True]  # the whole guarded buffer is the destination
        assert np.array_equal(arr[:pb], payload(0, pb)) and (arr[pb:] == GUARD).all()
    finally:
        s.close()


# ---------------------------------------------------------------------- layer-first
def _layer_layout(arr, base, pb_layers, sb, pages, gap, buffers=2):
    """Two raw host buffers (like tensor.data_ptr()) inside ``arr``: layers [0, k) and [k, n), ``gap`` bytes
    apart, so bytes between and around them are guards (``buffers=1``: one buffer, every layer back to back)."""
    a0 = arr.ctypes.data + base
    if buffers == 1:
        layout = PageLayout.layer_first((a0, pb_layers * pages * sb), n_layers=pb_layers, slice_bytes=sb,
                                        num_pages=pages)
        return layout, [base + l * pages * sb for l in range(pb_layers)]
    k = pb_layers // 2
    a1 = a0 + k * pages * sb + gap
    layout = PageLayout.layer_first([(a0, k * pages * sb), (a1, (pb_layers - k) * pages * sb)], n_layers=pb_layers,
                                    slice_bytes=sb, num_pages=pages, layers_per_buffer=[k, pb_layers - k])
    return layout, [(base if l < k else base + k * pages * sb + gap) + (l if l < k else l - k) * pages * sb
                    for l in range(pb_layers)]


@pytest.mark.parametrize("sb", [CHUNK, 64 * 132, 1000], ids=["glm5-chunk", "dsa-indexer", "odd"])
@pytest.mark.parametrize("base", [0, 4096, 512, 1, 100])
@pytest.mark.parametrize("vectored", [True, False], ids=["vectored", "single"])
@pytest.mark.parametrize("buffers", [2, 1], ids=["two-buffers", "one-buffer"])
def test_layer_first_reloads_land_in_each_chunk_exactly_and_nothing_else_moves(tmp_path, sb, base, vectored, buffers):
    """A single transfer into one buffer's evenly spaced layers is one strided copy (slab_reader._run), into two
    buffers a copy per chunk: either way exactly the page's chunks change."""
    n_layers, pages, gap = 4, 3, 4096 + 7
    pb = n_layers * sb
    s = open_store(tmp_path, pb)
    s.diagnostics().vectored = vectored
    try:
        spill(s, range(pages), pb)
        arr = guarded(base + n_layers * pages * sb + gap + 8192)
        layout, layer_at = _layer_layout(arr, base, n_layers, sb, pages, gap, buffers)
        assert s.reload_into_layout(K, [key(1)], layout, [1]) == [True]
        want = np.full_like(arr, GUARD)
        p = payload(1, pb)
        for l, at in enumerate(layer_at):
            want[at + sb:at + 2 * sb] = p[l * sb:(l + 1) * sb]  # page 1 of layer l
        assert np.array_equal(arr, want)  # page 1's chunks exact; pages 0 and 2, the gap, the margins untouched
        assert s.reload_into_layout(K, [key(0), key(2)], layout, [0, 2]) == [True, True]
        for pg in (0, 2):
            got = layout.page_spans(pg).pieces()
            assert b"".join(bytes(v) for v in got) == payload(pg, pb).tobytes()
        strided = s.diagnostics().io_counters()["strided_copies"]
        if buffers == 2:
            assert strided == 0  # spans in two buffers: a copy each
        elif not vectored:
            assert strided == 3  # every single transfer into the one buffer: one strided copy
        # (a vectored plan that bounces every span whole, as under coarse alignment, also takes the strided copy)
    finally:
        s.close()


def test_a_glm5_layer_first_page_is_read_with_no_payload_copy(tmp_path):
    """GLM-5's real geometry: 78 layers x 41,984 B. Under the 512 B (or finer) alignment this machine's ext4 and
    NVMe report, all 3,274,752 payload bytes go straight into the 78 chunks; only pad + header are bounced."""
    n_layers, pages = 78, 2
    pb = n_layers * CHUNK
    s = open_store(tmp_path, pb, slots=4)
    try:
        spill(s, [0], pb)
        arr = guarded(n_layers * pages * CHUNK)
        layout = PageLayout.for_mla_layer_first(arr, n_layers=n_layers, page_size=64, kv_cache_dim=656, itemsize=1,
                                                num_pages=pages)
        assert s.reload_into_layout(K, [key(0)], layout, [1]) == [True]
        lay = arr.reshape(n_layers, pages, CHUNK)
        assert np.array_equal(lay[:, 1].ravel(), payload(0, pb)) and (lay[:, 0] == GUARD).all()
        io = s.diagnostics().io_counters()
        align = next(iter(s.diagnostics().alignment().values()))
        if "mem 512 B" in align or "mem 4 B" in align:
            assert io["direct_bytes"] == pb and io["bounced_bytes"] == 0, align
    finally:
        s.close()


# ---------------------------------------------------------------------- misses
@pytest.mark.parametrize("where", ["payload_tail", "payload_head", "header", "header_version"])
def test_a_corrupt_slot_is_a_miss_that_touches_only_the_page_and_is_reclaimed(tmp_path, where):
    pb = 3 * CHUNK + 100
    slot = slot_bytes_for(pb)
    s = open_store(tmp_path, pb)
    try:
        spill(s, [5], pb)
        at = slot_of(s, 5) * slot
        offset = {"payload_tail": at + pb - 1, "payload_head": at, "header": at + slot - HEADER_SIZE + 20,
                  "header_version": at + slot - HEADER_SIZE + 8}[where]
        poke(s, offset, b"\x01" if where == "header_version" else bytes([0x5C]))
        arr = guarded(pb + 8192)
        dst = arr[1000:1000 + pb]
        assert s.reload_into(K, [key(5)], [dst]) == [False]
        assert (arr[:1000] == GUARD).all() and (arr[1000 + pb:] == GUARD).all()  # only the page's own bytes
        assert s.flush(30)
        assert s.exists(K, [key(5)]) == 0 and s.stats()["verify_failures"] == 1  # the entry was reclaimed
    finally:
        s.close()


@pytest.mark.parametrize("where", ["payload_tail", "payload_head", "header"])
def test_a_single_transfer_is_checked_before_its_copy_so_a_corrupt_page_never_touches_the_pool(tmp_path, where):
    """layer_first_reads = "single" into a one-buffer layer-first pool: the slot is checked in the bounce buffer and
    copied out only once it matched, so a corrupt page leaves its chunks as they were (a miss, reclaimed), and a good
    page in the same call lands exactly."""
    n_layers, pages = 4, 3
    pb = n_layers * CHUNK
    slot = slot_bytes_for(pb)
    s = open_store(tmp_path, pb)
    s.diagnostics().vectored = False
    try:
        spill(s, [0, 1], pb)
        at = slot_of(s, 1) * slot
        poke(s, {"payload_tail": at + pb - 1, "payload_head": at, "header": at + slot - HEADER_SIZE + 20}[where],
             bytes([0x5C]))
        arr = guarded(n_layers * pages * CHUNK)
        layout = PageLayout.layer_first(arr, n_layers=n_layers, slice_bytes=CHUNK, num_pages=pages)
        assert s.reload_into_layout(K, [key(0), key(1)], layout, [2, 1]) == [True, False]
        lay = arr.reshape(n_layers, pages, CHUNK)
        assert np.array_equal(lay[:, 2].ravel(), payload(0, pb))
        assert (lay[:, :2] == GUARD).all()  # the corrupt page's chunks (page 1) and page 0: never written
        assert s.diagnostics().io_counters()["strided_copies"] == 1  # the good page's; the corrupt one never copied
        assert s.flush(30)
        assert s.exists(K, [key(1)]) == 0 and s.stats()["verify_failures"] == 1
    finally:
        s.close()


def test_an_unknown_version_is_a_miss_whose_entry_stays(tmp_path):
    """A blob a newer build wrote (a rolling upgrade): not ours to serve and not ours to reclaim."""
    pb = 3 * CHUNK
    slot = slot_bytes_for(pb)
    s = open_store(tmp_path, pb)
    try:
        spill(s, [2], pb)
        poke(s, slot_of(s, 2) * slot + slot - HEADER_SIZE + 8, struct.pack("<H", 3))
        assert s.reload_into(K, [key(2)], [np.zeros(pb, np.uint8)]) == [False]
        assert s.flush(30)
        assert s.exists(K, [key(2)]) == 1 and s.stats()["verify_failures"] == 0
    finally:
        s.close()


def test_a_refused_direct_transfer_falls_back_and_still_reads_exact_bytes(tmp_path, monkeypatch):
    """A file system that reports less alignment than it needs: the reader re-plans under 4 KiB, then buffered,
    and the caller only sees the page."""
    import errno

    pb = 3 * CHUNK
    s = open_store(tmp_path, pb)
    try:
        spill(s, [4], pb)
        real, calls = os.preadv, []

        def refuse_twice(fd, bufs, offset):
            calls.append(len(bufs))
            if len(calls) <= 2:
                raise OSError(errno.EINVAL, "injected: alignment refused")
            return real(fd, bufs, offset)

        monkeypatch.setattr(os, "preadv", refuse_twice)
        arr = guarded(pb + 4096)
        dst = arr[512:512 + pb]
        assert s.reload_into(K, [key(4)], [dst]) == [True]
        monkeypatch.undo()
        assert np.array_equal(dst, payload(4, pb)) and (arr[:512] == GUARD).all() and (arr[512 + pb:] == GUARD).all()
        rd = next(iter(s.diagnostics().readers()))
        if len(calls) == 3:  # the reader was direct: 4 KiB plans, then buffered reads
            assert rd.io_mode == "buffered" and rd.align.source.startswith("buffered")
    finally:
        s.close()
