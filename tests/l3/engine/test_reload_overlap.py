"""Reloads check pages while the next reads are in flight (issue 28), and keep every guarantee of the read path:

* a page is a hit only once its checksum matched where it landed; a page that fails is a miss, counted, and its
  entry reclaimed; a checksum that cannot run costs only its page;
* nothing outside a page's own bytes changes (guard bytes around and between the destinations, and in the gaps
  between a layer-first page's chunks);
* the call returns only after every read and every checksum of the batch finished;
* reads never wait on a checksum;
* two pages of one call with the same destination: the second is refused (a bad_dst miss) before any byte moves;
* many pages, some corrupt, from several threads at once: results exact, no deadlock.

Real files, real O_DIRECT where the file system takes it."""

import hashlib
import mmap
import threading
import time

import numpy as np
import pytest

from sglang_glm_ext.l3.config import L3Config
from sglang_glm_ext.l3.disk import format as format_mod
from sglang_glm_ext.l3.disk.format import HEADER_SIZE, Namespace, PayloadKind, slot_bytes_for
from sglang_glm_ext.l3.disk.host_layout import PageLayout
from sglang_glm_ext.l3.disk.slab_reader import SlabReader
from sglang_glm_ext.l3.engine import reload as reload_mod
from sglang_glm_ext.l3.engine.store import L3Store

K = PayloadKind.TARGET_KV
NS = Namespace("glm5", "fp8", "layer_first", 64, 0, 3, "tp0")
LAYERS, CHUNK = 6, 64 * 656  # GLM-5's 41,984 B layer chunk (512 B-aligned, not 4 KiB-aligned), 6 layers
PB = LAYERS * CHUNK
GUARD = 0xA5


def key(i):
    return hashlib.sha256(f"ov{i}".encode()).hexdigest()


def payload(i):
    return np.frombuffer(hashlib.shake_256(f"ov{i}".encode()).digest(PB), np.uint8).copy()


def open_store(tmp_path, slots=40, threads=4):
    cfg = L3Config.from_dict({
        "deployment_id": "ov", "disks": [{"path": str(tmp_path / "disk"), "budget": slots * slot_bytes_for(PB)}],
        "index": {"path": str(tmp_path / "index"), "map_size": 2**24},
        "queues": {"staging_bytes": 16 * slot_bytes_for(PB), "io_threads": 2, "reload_threads": threads},
    })
    return L3Store.open(cfg, rank=0, namespace=NS, page_bytes={K: PB})


def spill(s, idxs):
    idxs = list(idxs)
    for b in range(0, len(idxs), 8):
        part = idxs[b:b + 8]
        assert all(s.spill(K, [key(i) for i in part], [payload(i) for i in part]))
        assert s.flush(30)


def guarded(nbytes):
    arr = np.frombuffer(mmap.mmap(-1, nbytes), np.uint8)
    arr[:] = GUARD
    return arr


def poke(s, i, where):
    """Corrupt one byte of page i's slot: in its payload (head or tail), its header, or its pad (never read as
    payload: the page stays good)."""
    slot = slot_bytes_for(PB)
    at = s.diagnostics().entry(K, key(i)).slot * slot
    off = {"payload_head": 0, "payload_tail": PB - 1, "header": slot - HEADER_SIZE + 20, "pad": PB + 7}[where]
    with open(s.slab(K).path, "r+b") as f:
        f.seek(at + off)
        b = f.read(1)
        f.seek(at + off)
        f.write(bytes([b[0] ^ 0x5C]))


# page i -> how it is damaged; pad damage leaves the page good
DAMAGE = {3: "payload_head", 7: "payload_tail", 11: "header", 12: "pad", 18: "payload_tail", 22: "header"}
N = 24


class Host:
    """N destinations in one guarded mapping: flat page-first arrays 1-2 KiB apart (odd addresses included), a
    page-first layout, a layer-first layout in two buffers with a gap, or in one; ``page_bytes(p)`` are the bytes page p
    may change, everything else must stay GUARD."""

    def __init__(self, form):
        self.form = form
        if form == "flat":
            self.arr = guarded(N * (PB + 2048) + 4096)
            self.at = [p * (PB + 2048) + (p % 3) * 512 + (1 if p == 5 else 0) for p in range(N)]
            self.dsts = [self.arr[a:a + PB] for a in self.at]
        elif form == "page_first":
            self.arr = guarded(N * PB + 8192)
            self.layout = PageLayout.page_first(self.arr[4096:4096 + N * PB], page_bytes=PB, num_pages=N)
        elif form == "layer_first_one_buffer":  # SGLang's layer-first pool: one buffer, every chunk 4 KiB-aligned+
            self.arr = guarded(LAYERS * N * CHUNK + 8192)
            self.layout = PageLayout.layer_first(self.arr[4096:4096 + LAYERS * N * CHUNK], n_layers=LAYERS,
                                                 slice_bytes=CHUNK, num_pages=N)
            self.layer_at = [4096 + l * N * CHUNK for l in range(LAYERS)]
        else:
            half, gap = LAYERS // 2, 4096 + 7
            self.arr = guarded(LAYERS * N * CHUNK + gap + 8192)
            a0 = self.arr.ctypes.data + 512
            a1 = a0 + half * N * CHUNK + gap
            self.layout = PageLayout.layer_first([(a0, half * N * CHUNK), (a1, half * N * CHUNK)], n_layers=LAYERS,
                                                 slice_bytes=CHUNK, num_pages=N, layers_per_buffer=[half, half])
            self.layer_at = [(512 if l < half else 512 + half * N * CHUNK + gap) + (l % half) * N * CHUNK
                             for l in range(LAYERS)]

    def reload(self, s, idxs, pages):
        if self.form == "flat":
            return s.reload_into(K, [key(i) for i in idxs], [self.dsts[p] for p in pages])
        return s.reload_into_layout(K, [key(i) for i in idxs], self.layout, pages)

    def pieces(self, p):
        """(offset in arr, length) of each piece of host page p, in payload order."""
        if self.form == "flat":
            return [(self.at[p], PB)]
        if self.form == "page_first":
            return [(4096 + p * PB, PB)]
        return [(at + p * CHUNK, CHUNK) for at in self.layer_at]

    def check(self, results, idxs, pages):
        want = np.full_like(self.arr, GUARD)
        mask = np.zeros(len(self.arr), bool)
        for ok, i, p in zip(results, idxs, pages):
            data, pos = payload(i), 0
            for off, n in self.pieces(p):
                if ok:
                    want[off:off + n] = data[pos:pos + n]
                else:
                    mask[off:off + n] = True  # a miss may have landed there: the page's own bytes only
                pos += n
        bad = (self.arr != want) & ~mask
        assert not bad.any(), f"{bad.sum()} bytes changed outside the hits' exact pages (first at {bad.argmax()})"


@pytest.mark.parametrize("threads", [2, 4], ids=["hand-off", "hash-on-reader"])
@pytest.mark.parametrize("form,vectored", [("flat", True), ("page_first", True), ("layer_first", True),
                                           ("layer_first", False)],
                         ids=["flat", "page-first", "layer-first-vectored", "layer-first-single"])
def test_many_pages_some_corrupt_results_exact_only_their_own_bytes_move(tmp_path, form, vectored, threads):
    s = open_store(tmp_path, threads=threads)
    s.diagnostics().vectored = vectored
    try:
        spill(s, range(N))
        for i, where in DAMAGE.items():
            poke(s, i, where)
        host = Host(form)
        idxs = list(range(N))
        pages = [(p * 7) % N for p in range(N)]  # scattered host pages
        got = host.reload(s, idxs, pages)
        assert got == [DAMAGE.get(i) in (None, "pad") for i in idxs]
        host.check(got, idxs, pages)
        assert s.flush(30)
        blamed = sum(1 for w in DAMAGE.values() if w != "pad")
        st = s.stats()
        assert st["verify_failures"] == blamed and st["reload_hits"] == N - blamed
        # exists() counts the leading run of keys present: ask page by page. Only the pad-damaged page is kept.
        assert [s.exists(K, [key(i)]) for i in DAMAGE] == [int(w == "pad") for w in DAMAGE.values()]
    finally:
        s.close()


@pytest.mark.parametrize("threads", [2, 4], ids=["hand-off", "hash-on-reader"])
def test_the_call_returns_only_after_every_checksum_and_a_hit_only_after_its_own(tmp_path, monkeypatch, threads):
    s = open_store(tmp_path, threads=threads)
    try:
        spill(s, range(16))
        poke(s, 4, "payload_tail")
        real = reload_mod.checksum_views
        active, done, lock = [0], [], threading.Lock()
        caller, returned, held = threading.current_thread(), threading.Event(), []

        def slow(pieces, **kw):
            with lock:
                active[0] += 1
                hold = not held and threading.current_thread() is not caller
                held.extend([None] * hold)
            if hold:
                # The first checksum off the caller's thread outlasts everything else the call does: a call that
                # returned without it would set `returned` meanwhile; one that waits for it cannot, so this wait
                # ends by its timeout whatever the machine's speed (the timeout only bounds the test).
                held[0] = returned.wait(2)
            h = real(pieces, **kw)
            with lock:
                active[0] -= 1
                done.append(h)
            return h

        monkeypatch.setattr(reload_mod, "checksum_views", slow)
        host = Host("page_first")
        got = host.reload(s, range(16), list(range(16)))
        returned.set()
        assert active[0] == 0 and len(done) == 16  # every checksum ran to its end before the call returned
        # the held one too (readers that hash their own always hold one; a hand-off may hash all on the caller)
        assert held == [False] or (held == [] and threads < reload_mod.HAND_OFF_BELOW), held
        assert got == [i != 4 for i in range(16)]
        host.check(got, range(16), list(range(16)))
    finally:
        s.close()


def test_reads_never_wait_on_a_checksum(tmp_path, monkeypatch):
    """One reader, and the first checksum held until every read of the batch has landed: the reader went on
    reading meanwhile. (Before issue 28 a thread read, then hashed, then read: this checksum would see 1 read.)"""
    s = open_store(tmp_path, threads=1)
    try:
        spill(s, range(8))
        reads = [0]  # pages read, alone (read_spans) or with their slot neighbours in one transfer (read_run)
        real_read, real_run, real_sum = SlabReader.read_spans, SlabReader.read_run, reload_mod.checksum_views
        all_read = threading.Event()

        def landed(pages):
            reads[0] += pages
            if reads[0] == 8:
                all_read.set()

        def counted(self, *a, **kw):
            r = real_read(self, *a, **kw)
            landed(1)
            return r

        def counted_run(self, slot, spans_list, *a, **kw):
            r = real_run(self, slot, spans_list, *a, **kw)
            landed(len(spans_list))
            return r

        seen, first = [], threading.Lock()

        def held(pieces, **kw):
            if first.acquire(blocking=False):  # the batch's first checksum, whoever runs it
                all_read.wait(60)  # a hang guard: a reader that waited on this checksum never lands them all
                seen.append(reads[0])
            return real_sum(pieces, **kw)

        monkeypatch.setattr(SlabReader, "read_spans", counted)
        monkeypatch.setattr(SlabReader, "read_run", counted_run)
        monkeypatch.setattr(reload_mod, "checksum_views", held)
        host = Host("page_first")
        assert host.reload(s, range(8), list(range(8))) == [True] * 8
        assert seen == [8]
    finally:
        s.close()


@pytest.mark.parametrize("form", ["flat", "flat-overlap", "layout"])
def test_the_same_destination_twice_in_one_call_is_refused(tmp_path, form):
    """Page B's read would land over page A's bytes after A verified, and both would say True (before issue 28,
    a serial reader did exactly that)."""
    s = open_store(tmp_path, threads=1)
    try:
        spill(s, [0, 1, 2])
        arr = guarded(2 * PB + 8192)
        if form == "layout":
            layout = PageLayout.page_first(arr[:2 * PB], page_bytes=PB, num_pages=2)
            got = s.reload_into_layout(K, [key(0), key(1), key(2)], layout, [1, 1, 0])
            a, c = arr[PB:2 * PB], arr[:PB]
        else:
            second = arr[:PB] if form == "flat" else arr[512:512 + PB]
            got = s.reload_into(K, [key(0), key(1), key(2)], [arr[:PB], second, arr[PB + 4096:2 * PB + 4096]])
            a, c = arr[:PB], arr[PB + 4096:2 * PB + 4096]
        assert got == [True, False, True]
        assert np.array_equal(a, payload(0)) and np.array_equal(c, payload(2))
        st = s.stats()
        assert st["reload_bad_dst"] == 1 and st["verify_failures"] == 0
        assert s.exists(K, [key(1)]) == 1  # the refused page is not the entry's fault
    finally:
        s.close()


def test_a_checksum_that_raises_costs_only_its_page(tmp_path, monkeypatch):
    s = open_store(tmp_path)
    try:
        spill(s, range(12))
        real = reload_mod.checksum_views
        bad = payload(5)[:64].tobytes()

        def flaky(pieces, **kw):
            if bytes(pieces[0][:64]) == bad:
                raise MemoryError("injected")
            return real(pieces, **kw)

        monkeypatch.setattr(reload_mod, "checksum_views", flaky)
        host = Host("flat")
        got = host.reload(s, range(12), list(range(12)))
        assert got == [i != 5 for i in range(12)]
        assert s.flush(30)
        st = s.stats()
        assert st["data_path_errors"] == 1 and st["verify_failures"] == 0 and s.exists(K, [key(5)]) == 1
    finally:
        s.close()


def test_calls_from_many_threads_at_once_with_small_pools_stay_exact(tmp_path):
    """Readers and helpers of four concurrent calls share two-thread pools: no call waits on another's tasks."""
    s = open_store(tmp_path, slots=48, threads=2)
    try:
        spill(s, range(N))
        for i, where in DAMAGE.items():
            poke(s, i, where)
        errors = []

        def worker(w):
            try:
                host = Host("page_first")
                for r in range(6):
                    idxs = [(w * 5 + r * 3 + j) % N for j in range(10)]
                    got = host.reload(s, idxs, list(range(10)))
                    assert got == [DAMAGE.get(i) in (None, "pad") for i in idxs]
                    host.check(got, idxs, list(range(10)))
                    host.arr[:] = GUARD
            except BaseException as e:  # noqa: BLE001 - surfaced below
                errors.append(e)

        ths = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
        for t in ths:
            t.start()
        for t in ths:
            t.join(120)
        assert not any(t.is_alive() for t in ths), "a reload call never returned"
        assert not errors, errors[0]
    finally:
        s.close()


@pytest.mark.parametrize("threads,where", [(1, "hand-off"), (2, "hand-off"), (4, "reader"), (8, "reader")])
def test_few_readers_hand_their_pages_off_many_hash_their_own(tmp_path, monkeypatch, threads, where):
    """Below reload.HAND_OFF_BELOW readers the checksums run off the read pool (the caller and hash helpers) so the
    few readers keep reading; from it on each reader hashes its own page (the others keep the disk busy, and the
    hand-off would only cost CPU: l3_design.md, issue 28)."""
    s = open_store(tmp_path, threads=threads)
    try:
        spill(s, range(16))
        real = reload_mod.checksum_views
        ran_on = []

        def spy(pieces, **kw):
            ran_on.append(threading.current_thread().name)
            return real(pieces, **kw)

        monkeypatch.setattr(reload_mod, "checksum_views", spy)
        host = Host("page_first")
        got = host.reload(s, range(16), list(range(16)))
        assert got == [True] * 16 and len(ran_on) == 16
        on_readers = sum(name.startswith("l3-rd-") for name in ran_on)
        if where == "reader":
            assert on_readers == 16, ran_on
        else:
            assert on_readers < 16 and any(not name.startswith("l3-rd-") for name in ran_on), ran_on
    finally:
        s.close()




@pytest.mark.parametrize("threads", [2, 8], ids=["hand-off", "hash-on-reader"])
@pytest.mark.parametrize("setting,per_page", [(None, 0), ("page", 1), ("64KiB", 3), ("off", 0), (0, 0)])
def test_layer_first_checksums_give_the_gil_up_page_first_ones_need_not(tmp_path, monkeypatch, threads, setting,
                                                                        per_page):
    """A layer-first page is hashed chunk by chunk holding the GIL (chunks of 64 KiB or less); its checksum gives the
    GIL up as queues.layer_first_gil_pause says -- "page": at each page's end (one pause a page), a size: also every
    that many bytes (64 KiB: after every second 41,984 B chunk, 3 a page here), "off" (the default): never -- so
    SGLang's scheduler thread need not wait for runs of pages hashed back to back (l3_design.md, issue 28, run 13). A
    page-first page is hashed in one call that releases the GIL itself: no pause. Results stay exact either way."""
    cfg = L3Config.from_dict({
        "deployment_id": "ov", "disks": [{"path": str(tmp_path / "disk"), "budget": 40 * slot_bytes_for(PB)}],
        "index": {"path": str(tmp_path / "index"), "map_size": 2**24},
        "queues": {"staging_bytes": 16 * slot_bytes_for(PB), "io_threads": 2, "reload_threads": threads,
                   **({} if setting is None else {"layer_first_gil_pause": setting})},
    })
    s = L3Store.open(cfg, rank=0, namespace=NS, page_bytes={K: PB})
    try:
        spill(s, range(16))
        sleeps = []

        class Time:
            @staticmethod
            def sleep(x):
                sleeps.append(x)
                time.sleep(x)

        monkeypatch.setattr(format_mod, "time", Time)
        for form, want in (("page_first", 0), ("layer_first", 16 * per_page),
                           ("layer_first_one_buffer", 16 * per_page)):
            sleeps.clear()
            host = Host(form)
            got = host.reload(s, range(16), list(range(16)))
            assert got == [True] * 16
            host.check(got, range(16), list(range(16)))
            assert sleeps == [0] * want, (form, len(sleeps))
    finally:
        s.close()

# ------------------------------------------------------------------------------ reads of adjacent slots (issue 28)
def open_coalescing(tmp_path, coalesce, threads=2):
    cfg = L3Config.from_dict({
        "deployment_id": "ov", "disks": [{"path": str(tmp_path / "disk"), "budget": 40 * slot_bytes_for(PB)}],
        "index": {"path": str(tmp_path / "index"), "map_size": 2**24},
        "queues": {"staging_bytes": 16 * slot_bytes_for(PB), "io_threads": 2, "reload_threads": threads,
                   "read_coalesce_bytes": coalesce},
    })
    return L3Store.open(cfg, rank=0, namespace=NS, page_bytes={K: PB})


def slots_of(s, idxs):
    return [s.diagnostics().entry(K, key(i)).slot for i in idxs]


@pytest.mark.parametrize("form", ["page_first", "layer_first_one_buffer"])
def test_pages_in_adjacent_slots_are_read_in_one_transfer_and_land_exactly(tmp_path, form):
    """Pages in adjacent slots come off the disk in one transfer each run (fewer reads than pages), whatever order
    the call names them in, and land exactly where one read a page puts them; with read_coalesce_bytes = 0 every
    page is a read of its own. Corrupt pages inside a run are misses and cost only themselves."""
    results = {}
    for coalesce in (0, 4 * slot_bytes_for(PB)):
        d = tmp_path / str(coalesce)
        d.mkdir()
        s = open_coalescing(d, coalesce)
        try:
            spill(s, range(N))
            assert sorted(slots_of(s, range(N))) == list(range(N))  # a fresh slab: adjacent slots
            for i in (5, 13):
                poke(s, i, "payload_tail")
            host = Host(form)
            idxs = list(range(N))[::-1]  # named in descending slot order: still runs
            pages = [(p * 7) % N for p in range(N)]
            got = host.reload(s, idxs, pages)
            assert got == [i not in (5, 13) for i in idxs]
            host.check(got, idxs, pages)
            io = s.diagnostics().io_counters()
            assert io["span_reads"] == N
            results[coalesce] = (io["run_reads"], io["run_pages"])
            assert s.flush(30)
            assert s.stats()["verify_failures"] == 2 and [s.exists(K, [key(i)]) for i in (5, 13)] == [0, 0]
        finally:
            s.close()
    assert results[0] == (0, 0)
    reads, pages = results[4 * slot_bytes_for(PB)]
    # 24 pages, 2 readers: runs of at most 4 pages (the byte cap), at least 2 runs a reader
    assert pages == N and N // 4 <= reads < N


def test_an_io_error_inside_a_run_costs_only_its_page(tmp_path, monkeypatch):
    """EIO on one slot of a run: the run is read again page by page, so only the page whose slot fails is a miss
    (counted as a data-path error on its disk, its entry kept: the bytes were never seen), its neighbours hit."""
    import os

    s = open_coalescing(tmp_path, 8 * slot_bytes_for(PB))
    try:
        spill(s, range(8))
        bad = slots_of(s, [3])[0] * slot_bytes_for(PB)
        real = os.preadv
        runs = []

        def failing(fd, iov, pos):
            n = sum(len(v) for v in iov)
            if n > slot_bytes_for(PB):
                runs.append(n)
            if pos <= bad < pos + n:
                raise OSError(5, "Input/output error")
            return real(fd, iov, pos)

        monkeypatch.setattr(os, "preadv", failing)
        host = Host("page_first")
        got = host.reload(s, range(8), list(range(8)))
        monkeypatch.setattr(os, "preadv", real)
        assert runs, "no transfer covered more than one slot"
        assert got == [i != 3 for i in range(8)]
        host.check(got, range(8), list(range(8)))
        st = s.stats()
        assert st["data_path_errors"] == 1 and st["verify_failures"] == 0
        assert sum(d.get("read_errors", 0) for d in st["per_disk"].values()) == 1
        assert s.exists(K, [key(3)]) == 1
    finally:
        s.close()


@pytest.mark.parametrize("coalesce", [0, 8], ids=["page-by-page", "runs"])
def test_a_failure_no_layer_maps_inside_the_innermost_read_is_a_counted_miss_never_an_exception(tmp_path, monkeypatch,
                                                                                               coalesce):
    """Not an I/O error (a bug under the read): the step it broke (one page's read, or one run's: at most the pages
    of its unit) is a miss, counted as a data-path error against its disk with its entry kept, and every other page
    of the call still hits exactly; nothing reaches the caller."""
    import os

    s = open_coalescing(tmp_path, coalesce * slot_bytes_for(PB))
    try:
        spill(s, range(8))
        bad = slots_of(s, [3])[0] * slot_bytes_for(PB)
        real = os.preadv

        def failing(fd, iov, pos):
            if pos <= bad < pos + sum(len(v) for v in iov):
                raise RuntimeError("injected: not an OSError")
            return real(fd, iov, pos)

        monkeypatch.setattr(os, "preadv", failing)
        host = Host("page_first")
        got = host.reload(s, range(8), list(range(8)))
        monkeypatch.setattr(os, "preadv", real)
        missed = got.count(False)
        assert not got[3] and (missed == 1 if not coalesce else 1 <= missed <= 2), got
        host.check(got, range(8), list(range(8)))
        st = s.stats()
        assert st["data_path_errors"] == missed and st["verify_failures"] == 0 and st["reload_misses"] == missed
        assert sum(d.get("read_errors", 0) for d in st["per_disk"].values()) == missed
        assert s.exists(K, [key(3)]) == 1  # the bytes were never seen: the entry stays
    finally:
        s.close()


def test_a_failure_outside_any_read_makes_the_call_misses_counted_and_gives_staged_pages_back(tmp_path,
                                                                                                monkeypatch):
    """The read path's one net (Reloader.reload): the index read raising mid-call costs the call's pages (one
    data-path error, logged), hands back every staged copy it borrowed and leaves no page counted in flight; the
    next call reads again."""
    s = open_store(tmp_path)
    try:
        spill(s, range(4))
        borrowed, given = [], []
        staged = s.diagnostics().staged
        real_borrow, real_give = staged.borrow, staged.give_back
        monkeypatch.setattr(staged, "borrow", lambda *a: borrowed.append(real_borrow(*a)) or borrowed[-1])
        monkeypatch.setattr(staged, "give_back", lambda pages: given.append(pages) or real_give(pages))

        def broken(keys):
            raise RuntimeError("injected: the index read failed")

        monkeypatch.setattr(s.index, "get_many", broken)
        host = Host("flat")
        assert host.reload(s, range(4), list(range(4))) == [False] * 4
        assert given == borrowed and len(given) == 1
        st = s.stats()
        assert st["data_path_errors"] == 1 and st["reload_inflight"] == 0 and st["verify_failures"] == 0
        monkeypatch.undo()
        assert host.reload(s, range(4), list(range(4))) == [True] * 4
    finally:
        s.close()


def test_a_run_past_the_end_of_its_slab_serves_the_pages_before_the_end(tmp_path):
    """A slab cut short (another rank's file, a truncated copy): the run's transfer ends early; the pages whose
    slots are whole still hit, the ones past the end are misses."""
    import os

    s = open_coalescing(tmp_path, 8 * slot_bytes_for(PB))
    try:
        spill(s, range(8))
        assert slots_of(s, range(8)) == list(range(8))
        os.truncate(s.slab(K).path, 5 * slot_bytes_for(PB) + 100)  # inside the run of slots 4-5
        host = Host("page_first")
        got = host.reload(s, range(8), list(range(8)))
        assert got == [i < 5 for i in range(8)]
        host.check(got, range(8), list(range(8)))
    finally:
        s.close()


def test_a_slow_read_does_not_hold_back_the_units_behind_it():
    """Readers take the next unit when they are free: while one reader's read hangs, the others read every other
    unit (a fixed share per reader would leave the hanging reader's later units unread until it returns)."""
    from concurrent.futures import ThreadPoolExecutor

    from sglang_glm_ext.l3.engine.read_batch import ReadBatch

    for readers in (2, 4):  # the caller hashes (hand-off), and each reader hashes its own
        pool, hash_pool = ThreadPoolExecutor(readers), ThreadPoolExecutor(1)
        others_done = threading.Event()
        seen, waited = [], []

        def fn(unit_jobs):
            if unit_jobs[0] == 0:
                waited.append(others_done.wait(10))
            else:
                seen.append(unit_jobs[0])
                if len(seen) == 9:
                    others_done.set()
            return [(True, "ok")] * len(unit_jobs)

        try:
            batch = ReadBatch(fn, None, 10, pool=pool, hash_pool=hash_pool, helpers=1, reload_threads=readers)
            out = batch.run([[j] for j in range(10)])
        finally:
            pool.shutdown()
            hash_pool.shutdown()
        assert waited == [True], "units behind the slow read waited for it"
        assert out == [(True, "ok")] * 10 and sorted(seen) == list(range(1, 10))
