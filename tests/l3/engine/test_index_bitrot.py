"""Issue 24, item 2: no bytes in the index file may crash the process that opens it.

Random byte flips anywhere in ``data.mdb`` never kill a restarted rank, and every page it serves afterwards is
byte-exact or a miss. Each trial copies a store built once (one rank on two disks, so entries name both; pages
spilled, and pages spilled then freed, so the free list holds old leaf copies with deleted entries), XORs K random
bytes anywhere in ``data.mdb`` and runs the restarted rank in a CHILD process (a signal is then a counted outcome,
not a dead pytest): ``L3Store.open(cold_start="load")`` -- whose index open runs inside ``index_check.guarded`` --,
a reload of every page (bytes compared), 32 new pages spilled and reloaded, reader_check, stat, close, and the
next restart's open (which must find the file sound).

The negative control runs the same kind of flips with the guard off (a test-only switch) and must see them break
the open: the proof that the flips have teeth. The other tests pin the salvage's rules one by one: never a deleted
entry back (a pointer flipped onto a freed leaf; a flipped meta txnid that makes LMDB itself roll back one commit),
nothing lost to a cut-off subtree (orphaned leaves adopted), no false alarm after a crash, and nobody checks or
replaces a file another process has open.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from sglang_glm_ext.l3 import config as config_mod
from sglang_glm_ext.l3.config import L3Config
from sglang_glm_ext.l3.disk.aligned import AlignedBuffer
from sglang_glm_ext.l3.disk.format import Namespace, PayloadKind, seal_blob
from sglang_glm_ext.l3.disk.slab import DiskSlab
from sglang_glm_ext.l3.engine import index as index_mod
from sglang_glm_ext.l3.engine import index_check, index_salvage, index_walk
from sglang_glm_ext.l3.engine.index import (IndexDamagedError, IndexEntry, KeySpace, L3Index, deployment_tag,
                                            make_key)
from sglang_glm_ext.l3.engine.store import L3Store

REPO = str(Path(__file__).resolve().parents[3])
PB = 4096 - 128  # one 4 KiB slot per page: many entries per MiB of slab
N = 1500
K = PayloadKind.TARGET_KV
NS = Namespace("bitrot", "bf16", "page_first", 64, 0, 1, "tp0")


def key(i, salt="p"):
    return hashlib.sha256(f"{salt}{i}".encode()).hexdigest()


def page(i, salt="p"):
    return np.frombuffer(hashlib.shake_256(f"{salt}{i}".encode()).digest(PB), np.uint8).copy()


def cfg_dict(root, check="fast", on_damage="salvage"):
    # Room for every page on either disk: a disk that is slow for a moment sheds new pages to the other, and a GC
    # there would make the base's entries depend on the machine's load.
    return {"deployment_id": "bitrot", "ranks": {"mapping": [[0, 1]]},
            "disks": [{"path": str(Path(root) / "disk0"), "budget": 2048 * 4096},
                      {"path": str(Path(root) / "disk1"), "budget": 2048 * 4096}],
            "index": {"path": str(Path(root) / "index"), "map_size": 2**26, "check": check, "on_damage": on_damage},
            "gc": {"start": 0.95, "stop": 0.9}}


CHILD = textwrap.dedent(f"""
    import hashlib, json, sys
    import numpy as np
    from sglang_glm_ext.l3.config import L3Config
    from sglang_glm_ext.l3.disk.format import Namespace, PayloadKind
    from sglang_glm_ext.l3.engine import index as index_mod
    from sglang_glm_ext.l3.engine.store import L3Store
    PB, N, K = {PB}, {N}, PayloadKind.TARGET_KV
    def key(i, salt="p"):
        return hashlib.sha256(f"{{salt}}{{i}}".encode()).hexdigest()
    def page(i, salt="p"):
        return np.frombuffer(hashlib.shake_256(f"{{salt}}{{i}}".encode()).digest(PB), np.uint8).copy()
    index_mod._UNGUARDED_FOR_TESTS = sys.argv[2] == "unguarded"  # test-only: the negative control
    cfg = L3Config.from_dict(json.loads(sys.argv[1]))
    s = L3Store.open(cfg, rank=0, namespace=Namespace("bitrot", "bf16", "page_first", 64, 0, 1, "tp0"),
                     page_bytes={{K: PB}}, cold_start="load")
    st = s.stats()
    keys = [key(i) for i in range(N)]
    hits = wrong = 0
    disks = set()
    for b in range(0, N, 128):
        idx = list(range(b, min(N, b + 128)))
        dst = [np.zeros(PB, np.uint8) for _ in idx]
        for i, ok, d in zip(idx, s.reload_into(K, [keys[i] for i in idx], dst), dst):
            hits += bool(ok)
            wrong += bool(ok) and not np.array_equal(d, page(i))
    for k in keys[:200]:
        e = s.diagnostics().entry(K, k)
        if e is not None:
            disks.add(e.disk)
    new = [key(i, "new") for i in range(32)]
    s.spill(K, new, [page(i, "new") for i in range(32)], wait=10)
    s.flush(60)
    dst = [np.zeros(PB, np.uint8) for _ in new]
    ok = s.reload_into(K, new, dst)
    wrong += sum(1 for i, (o, d) in enumerate(zip(ok, dst)) if o and not np.array_equal(d, page(i, "new")))
    s.index.reader_check()
    s.index.stat()
    s.close()
    ix = index_mod.L3Index.open(cfg.index_path, cfg.index_map_size, check=cfg.index_check)  # the next restart
    again = ix.verdict.action if ix.verdict else None
    ix.close()
    print("RESULT", json.dumps({{"action": st["index_check"], "again": again, "repaired": st["index_repaired"],
                                "kept": st["index_salvage_kept"], "moved_to": st["index_moved_to"], "hits": hits,
                                "wrong": wrong, "new_hits": sum(ok), "disks": sorted(disks)}}), flush=True)
""")


def build_base(root: Path) -> Path:
    """One rank's store on two disks, the same bytes on every run: page ``i`` is sealed into disk ``i % 2``, slot
    ``i // 2``, in order, by one thread, and the index gets fixed batches of entries with fixed access times, then
    300 entries put and deleted (the free list holds leaf copies with deleted entries). The store's own spill would
    place and batch pages by the writer and committer threads' timing, and LMDB would fill the unused bytes of its
    pages from the heap (``meminit=False``): a different file each run, so the same flips would hit other bytes."""
    lmdb_open = index_mod.lmdb.open
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(index_mod.lmdb, "open", lambda *a, **kw: lmdb_open(*a, **dict(kw, meminit=True)))
        _write_base(root)
    return root


def _write_base(root: Path) -> None:
    cfg = L3Config.from_dict(cfg_dict(root))
    L3Store.open(cfg, rank=0, namespace=NS, page_bytes={K: PB}, cold_start="clear").close()  # the slabs' layout
    ns = NS.digest_for(cfg.deployment_id)
    space = KeySpace(deployment_tag(cfg.deployment_id), ns)
    slabs = [DiskSlab.open(Path(d["path"]) / "bitrot" / "rank0" / "target_kv.slab", slot_bytes=4096,
                           num_slots=2048, create=False) for d in cfg_dict(root)["disks"]]
    buf = AlignedBuffer(4096)
    ix = L3Index.open(cfg.index_path, cfg.index_map_size)
    try:
        def put(salt, idx, first_slot):
            items = []
            for i in idx:
                h = bytes.fromhex(key(i, salt))
                np.frombuffer(buf.view, np.uint8)[:PB] = page(i, salt)
                seal_blob(buf.view, kind=K, content_hash=h, ns_digest=ns, payload_len=PB)
                disk, slot = i % 2, first_slot + i // 2
                slabs[disk].write_slot(slot, buf)
                items.append((space.key(K, h), IndexEntry(0, disk, slot, 1_000_000 + i)))
            for s in slabs:
                s.sync()
            assert ix.commit_puts(items) == [None] * len(items)
            return items

        for b in range(0, N, 250):
            put("p", range(b, min(N, b + 250)), 0)
        churn = put("churn", range(300), N // 2)
        assert ix.delete_if(churn) == [True] * 300
    finally:
        ix.close()
        buf.close()
        for s in slabs:
            s.close()


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return build_base(tmp_path_factory.mktemp("bitrot_base"))


def _digest(root: Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))
            if p.is_file() and (p.name == "data.mdb" or p.suffix == ".slab")}


def test_the_base_is_the_same_bytes_on_every_build(base, tmp_path):
    """What the trials flip is fixed by their seeds: the same bytes of the same file, so every outcome replays."""
    again = _digest(build_base(tmp_path / "again"))
    assert again == _digest(base) and len(again) == 3, sorted(again)
    # The store serves the built base as its own (a copy: a reload's access times are written back at close).
    shutil.copytree(base, tmp_path / "served")
    s = L3Store.open(L3Config.from_dict(cfg_dict(tmp_path / "served")), rank=0, namespace=NS, page_bytes={K: PB},
                     cold_start="load")
    try:
        dst = [np.zeros(PB, np.uint8) for _ in range(N)]
        assert all(s.reload_into(K, [key(i) for i in range(N)], dst))
        assert all(np.array_equal(d, page(i)) for i, d in enumerate(dst))
        assert {s.locate(K, key(i))[1] for i in range(N)} == {0, 1}
    finally:
        s.close()


def _flip(path, k, rng):
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        for _ in range(k):
            off = rng.randrange(size)
            f.seek(off)
            b = f.read(1)[0]
            f.seek(off)
            f.write(bytes([b ^ rng.randrange(1, 256)]))


def _trial(base, work, k, rng, guard=True, check="fast", flip=None):
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(base, work)
    (flip or _flip)(work / "index" / "data.mdb", k, rng)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        res = subprocess.run([sys.executable, "-c", CHILD, json.dumps(cfg_dict(work, check)),
                              "guarded" if guard else "unguarded"], capture_output=True, text=True, env=env,
                             timeout=120)
    except subprocess.TimeoutExpired:
        return "hang", {}, ""
    if res.returncode < 0:
        return signal.Signals(-res.returncode).name, {}, res.stderr[-2000:]
    if res.returncode != 0:
        return "exception", {}, res.stderr[-2000:]
    line = [x for x in res.stdout.splitlines() if x.startswith("RESULT ")]
    return "ok", json.loads(line[0][7:]) if line else {}, res.stderr[-2000:]


def _run(base, tmp_path, trials, seed, check="fast"):
    rng = random.Random(seed)
    out = []
    for t in range(trials):
        k = (1, 8, 64)[t % 3]
        outcome, info, err = _trial(base, tmp_path / "trial", k, rng, check=check)
        out.append((k, outcome, info, err))
    return out


def _assert_survived(trials):
    bad = [(k, o, err[-600:]) for k, o, _, err in trials if o != "ok"]
    assert not bad, f"{len(bad)} of {len(trials)} trials did not end ok; first: {bad[:2]}"
    assert all(info["wrong"] == 0 for _, _, info, _ in trials), "a page was served with wrong bytes"
    assert all(info["new_hits"] == 32 for _, _, info, _ in trials), \
        ("the opened index did not take new pages", [(k, info, err[-800:]) for k, _, info, err in trials
                                                     if info["new_hits"] != 32])
    # The next restart finds a sound file (a repaired index is not repaired again, nor moved aside again).
    assert all(info["again"] == "verified" for _, _, info, _ in trials), [i["again"] for _, _, i, _ in trials]
    salvaged = [info for _, _, info, _ in trials if info["action"] == "salvaged"]
    assert salvaged, f"no trial found damage ({[i['action'] for _, _, i, _ in trials]}): the repair went untested"
    for info in salvaged:  # the verdict is surfaced, and what was kept is served from both disks
        assert info["repaired"] == 1 and os.path.basename(info["moved_to"]).startswith("data.mdb.damaged-")
        assert info["hits"] <= info["kept"] <= N
    assert any(info["disks"] == [0, 1] for info in salvaged)
    return salvaged


def test_random_flips_across_the_whole_index_file_never_kill_the_open_nor_serve_wrong_bytes(base, tmp_path):
    """A few trials in the quick lane (1, 8 and 64 flips, three times each); the many-trial sweep below is slow."""
    salvaged = _assert_survived(_run(base, tmp_path, 9, seed=2024))
    assert max(info["hits"] for info in salvaged) >= N * 0.95  # a salvage keeps (almost) everything it can prove


# Trials per check mode in the slow sweep: 48 in the suite (about 20 s each mode here); issue 24's closing run took
# 150 per mode. Raise it for a longer soak: SGLANG_GLM_EXT_TEST_BITROT_TRIALS=150 pytest -k many_random_flips.
SWEEP_TRIALS = int(os.environ.get("SGLANG_GLM_EXT_TEST_BITROT_TRIALS", "48"))


@pytest.mark.slow
@pytest.mark.parametrize("check", ["fast", "full"])
def test_many_random_flips_across_the_whole_index_file(base, tmp_path, check):
    _assert_survived(_run(base, tmp_path, SWEEP_TRIALS, seed={"fast": 7, "full": 8}[check], check=check))


def _flip_pointers(path, k, rng):
    """XOR the high half of ``k`` child page numbers of the pages tree's branch pages (the nodes the guard's walk
    reaches from the newest meta): each names a page far past the end of the file, which an unguarded open's
    cold-start scan reads on its way to every entry. Random flips anywhere may land only in free copies and unused
    bytes (most of the file) and leave the open clean."""
    f = index_walk.PageFile(str(path))
    try:
        m = max(index_walk.read_metas(f), key=lambda x: x["txnid"])
        w = index_walk.TreeWalk(f, m["last_pg"], bytearray(m["last_pg"] + 1))
        w.walk(_pages_db(f, m)[7], 32, None)
        nodes = []
        for pg in range(2, m["last_pg"] + 1):
            buf = f.page(pg) if w.seen[pg] else None
            if buf is not None and buf[10] == 0x01:  # P_BRANCH
                n = (struct.unpack_from("<H", buf, 12)[0] - 16) >> 1
                nodes += [pg * f.psize + struct.unpack_from("<H", buf, 16 + 2 * i)[0] for i in range(n)]
    finally:
        f.close()
    assert nodes, "the pages tree has no branch page: the base is too small to aim at"
    with open(path, "r+b") as fh:
        for at in rng.sample(nodes, k):
            fh.seek(at + 2)
            hi = struct.unpack("<I", fh.read(4))[0]
            fh.seek(at + 2)
            fh.write(struct.pack("<I", hi ^ rng.randrange(1, 2**32)))  # page number >= 2**16, the file is ~160 pages


def test_negative_control_the_same_flips_break_an_unguarded_open(base, tmp_path):
    """The guard off (the open before the guard): flips aimed at the tree an open walks make the open raise (py-lmdb
    3's hardened engine refuses the page at the cold-start scan: that rank has no L3) or kill it (SIGBUS / SIGSEGV /
    SIGABRT), in every trial. The same flips under the guard: every trial ok, the damage salvaged, every entry kept
    (the cut-off leaves are adopted) and served byte-exact."""
    def trials(guard):  # the same four sets of flips on both sides
        return [_trial(base, tmp_path / "trial", 4, random.Random(99 + t), guard=guard, flip=_flip_pointers)
                for t in range(4)]

    unguarded = trials(guard=False)
    assert not [o for o, _, _ in unguarded if o == "ok"], [(o, err[-300:]) for o, _, err in unguarded]
    guarded = trials(guard=True)
    assert [o for o, _, _ in guarded] == ["ok"] * 4, [(o, err[-600:]) for o, _, err in guarded]
    for _, info, _ in guarded:
        assert (info["action"], info["kept"], info["hits"], info["wrong"]) == ("salvaged", N, N, 0), info


def test_a_store_with_on_damage_reset_starts_with_an_empty_index_and_keeps_the_file_aside(base, tmp_path):
    """index.on_damage = "reset": nothing of a damaged file is kept (its pages are misses), never a signal."""
    work = tmp_path / "w"
    shutil.copytree(base, work)
    _flip(work / "index" / "data.mdb", 64, random.Random(5))
    assert not index_check.check_index(str(work / "index"))[0]
    s = L3Store.open(L3Config.from_dict(cfg_dict(work, on_damage="reset")), rank=0, namespace=NS,
                     page_bytes={K: PB}, cold_start="load")
    try:
        st = s.stats()
        assert (st["index_check"], st["index_repaired"], st["index_salvage_kept"]) == ("reset", 1, 0)
        assert s.index.count() == 0 and s.loaded_pages == 0
        assert os.path.getsize(st["index_moved_to"]) == os.path.getsize(base / "index" / "data.mdb")
        assert not any(s.exists(K, [key(i)]) for i in range(0, N, 50))
    finally:
        s.close()


def test_the_config_keys_and_the_layout_agree_with_the_guard():
    assert config_mod.INDEX_CHECK_MODES == index_check.CHECK_MODES
    assert config_mod.INDEX_ON_DAMAGE == index_check.ON_DAMAGE
    assert (index_salvage.KEY_LEN, index_salvage.VALUE_LEN) == (index_mod.KEY_LEN, index_mod.VALUE_LEN)
    d = cfg_dict("/tmp/x")
    assert (L3Config.from_dict(d).index_check, L3Config.from_dict(d).index_on_damage) == ("fast", "salvage")
    for k, v in (("check", "paranoid"), ("on_damage", "refuse"), ("check", 1)):
        bad = dict(d, index=dict(d["index"], **{k: v}))
        with pytest.raises(config_mod.L3ConfigError, match=f"^index.{k}: "):
            L3Config.from_dict(bad)


# ---- the salvage's rules, one by one, on a bare index ----

def _leaf_keys(buf):
    lower = struct.unpack_from("<H", buf, 12)[0]
    out = []
    for i in range((lower - 16) >> 1):
        o = struct.unpack_from("<H", buf, 16 + 2 * i)[0]
        ks = struct.unpack_from("<H", buf, o + 6)[0]
        out.append(bytes(buf[o + 8:o + 8 + ks]))
    return out


def _filled(path, n, batches=500):
    ix = L3Index.open(str(path), 2**24)
    dep, ns = deployment_tag("d"), b"N" * 16
    items = [(make_key(dep, ns, 1, i.to_bytes(32, "big")), IndexEntry(0, i % 2, i, 1)) for i in range(n)]
    for b in range(0, n, batches):
        assert ix.commit_puts(items[b:b + batches]) == [None] * len(items[b:b + batches])
    return ix, dep, items


def _pages_db(f, m):
    recs = []
    w = index_walk.TreeWalk(f, m["last_pg"], bytearray(m["last_pg"] + 1))
    w.walk(m["main"][7], 32, lambda k, nfl, v: recs.append((k, v)))
    return struct.unpack_from("<IHHQQQQQ", [v for k, v in recs if k == b"pages"][0], 0)


def _poke_page(data, pgno, buf):
    with open(data, "r+b") as fh:
        fh.seek(pgno * 4096)
        fh.write(buf)


def test_a_pointer_flipped_onto_a_freed_leaf_never_resurrects_its_deleted_entries(tmp_path):
    """A freed leaf page still holds entries a clear / free deleted (LMDB is copy-on-write). A damaged branch pointer
    that reaches it must not bring them back: they may be pages a clear dropped after a weight update, and such a
    blob still verifies byte-exact, so nothing downstream could catch it."""
    path = tmp_path / "idx"
    ix, dep, items = _filled(path, 3000)
    gone = {k for k, _ in items[1000:2000]}
    assert ix.delete_if(items[1000:2000]) == [True] * 1000
    ix.close()
    data = path / "data.mdb"
    f = index_walk.PageFile(str(data))
    m = max(index_walk.read_metas(f), key=lambda x: x["txnid"])
    free, _, _ = index_walk.free_pages(f, m)
    old = [p for p in range(2, m["last_pg"] + 1) if free[p] and f.page(p)[10:12] == b"\x02\x00"
           and gone & set(_leaf_keys(f.page(p)))]
    assert old, "no freed leaf with deleted entries (the set-up did not make one)"
    root = _pages_db(f, m)[7]  # the pages DB root is a branch page: point its first child at the freed leaf
    buf = bytearray(f.page(root))
    f.close()
    assert buf[10] == 0x01
    o = struct.unpack_from("<H", buf, 16)[0]
    struct.pack_into("<HHH", buf, o, old[0] & 0xFFFF, (old[0] >> 16) & 0xFFFF, 0)
    _poke_page(data, root, buf)
    ok, problems = index_check.check_index(str(path))
    assert not ok and any("listed as free" in p for p in problems), problems
    records, info = index_check.salvage_records(str(data))
    assert records and not gone & {k for k, _ in records}
    ix = L3Index.open(str(path), 2**24)  # through the open: the repaired index holds none of them
    try:
        left = {k for k, _ in ix.scan(dep).items}
        assert not gone & left and len(left) == len(records) and ix.verdict.action == "salvaged"
    finally:
        ix.close()
    assert list(path.glob("data.mdb.damaged-*")), "the damaged file is kept aside for the operator"


def test_a_damaged_branch_pointer_loses_no_entry_its_orphaned_leaves_are_adopted(tmp_path):
    """A pointer flipped out of range cuts a subtree off; with the free list intact, a leaf that is neither reachable
    nor free was live until the damage, so the salvage adopts it: every entry is kept, values included."""
    path = tmp_path / "idx"
    ix, dep, items = _filled(path, 3000)
    ix.close()
    data = path / "data.mdb"
    f = index_walk.PageFile(str(data))
    m = max(index_walk.read_metas(f), key=lambda x: x["txnid"])
    db = _pages_db(f, m)
    pg = db[7]
    for _ in range(db[2] - 2):  # down the first children to a branch whose children are leaves
        o = struct.unpack_from("<H", f.page(pg), 16)[0]
        lo, hi, fl = struct.unpack_from("<HHH", f.page(pg), o)
        pg = lo | hi << 16 | fl << 32
    buf = bytearray(f.page(pg))
    f.close()
    assert buf[10] == 0x01 and db[2] >= 2
    n = (struct.unpack_from("<H", buf, 12)[0] - 16) >> 1
    o = struct.unpack_from("<H", buf, 16 + 2 * (n // 2))[0]
    struct.pack_into("<HHH", buf, o, 0xFFFF, 0xFFFF, 0x7FFF)  # a child page number far past the end of the file
    _poke_page(data, pg, buf)
    assert not index_check.check_index(str(path))[0]
    records, info = index_check.salvage_records(str(data))
    assert info["adopted"] > 0 and dict(records) == {k: e.pack() for k, e in items}
    ix = L3Index.open(str(path), 2**24)
    try:
        assert dict(ix.scan(dep).items) == dict(items)
        assert (ix.verdict.action, ix.verdict.kept, ix.verdict.claimed) == ("salvaged", 3000, 3000)
    finally:
        ix.close()


def _last_deleted(tmp_path, n=2000):
    """An index whose last commit deleted 100 entries: its older meta page is the snapshot that still has them."""
    path = tmp_path / "idx"
    ix, dep, items = _filled(path, n, batches=1000)
    assert ix.delete_if(items[:100]) == [True] * 100  # the last commit
    ix.close()
    f = index_walk.PageFile(str(path / "data.mdb"))
    ms = sorted(index_walk.read_metas(f), key=lambda x: x["txnid"])
    f.close()
    assert len(ms) == 2 and ms[1]["txnid"] == ms[0]["txnid"] + 1
    return path, dep, items, ms[1], ms[0]


def _kept_after_open(path, dep):
    """Open through the guard (a damaged file is salvaged): the deployment's keys the index then holds."""
    ix = L3Index.open(str(path), 2**24)
    try:
        return {k for k, _ in ix.scan(dep).items}, ix.verdict.action
    finally:
        ix.close()


def test_a_flipped_meta_txnid_neither_rolls_the_index_back_nor_loses_it(tmp_path, monkeypatch):
    """A flip that lowers the newest meta's txnid makes LMDB open the older snapshot: the last commit's deletes come
    back (a silent rollback; asserted below as the negative control). The guard sees the metas disagree and salvages
    the snapshot whose trees are newest."""
    path, dep, items, newest, _ = _last_deleted(tmp_path)
    gone = {k for k, _ in items[:100]}
    with open(path / "data.mdb", "r+b") as fh:
        fh.seek(newest["slot"] * 4096 + 16 + 24 + 96 + 8)
        fh.write(struct.pack("<Q", newest["slot"]))  # txnid 0 / 1: lower than the older meta's
    shutil.copytree(path, tmp_path / "unguarded")
    monkeypatch.setattr(index_mod, "_UNGUARDED_FOR_TESTS", True)
    ix = L3Index.open(str(tmp_path / "unguarded"), 2**24)
    try:
        assert gone <= {k for k, _ in ix.scan(dep).items}, "LMDB alone rolls back: the deletes are back"
    finally:
        ix.close()
    monkeypatch.setattr(index_mod, "_UNGUARDED_FOR_TESTS", False)
    kept, action = _kept_after_open(path, dep)
    assert action == "salvaged" and kept == {k for k, _ in items[100:]}


@pytest.mark.parametrize("field,offset", [("flags", 10), ("magic", 16), ("version", 20)])
def test_a_newest_meta_page_lmdb_would_reject_does_not_roll_the_index_back(tmp_path, field, offset):
    """A flip in the newest meta page's flags, magic or version: LMDB refuses the file (MDB_INVALID, or another data
    format), so the guard salvages -- and the salvage used to take the one page left, the older snapshot, bringing
    the last commit's deletes back. It reads that page's fields anyway: its txnid and its trees agree and pair with
    the older page's, so the newest commit is what is kept, all of it and nothing it deleted."""
    path, dep, items, newest, _ = _last_deleted(tmp_path)
    with open(path / "data.mdb", "r+b") as fh:
        at = newest["slot"] * 4096 + offset
        fh.seek(at)
        b = fh.read(1)[0]
        fh.seek(at)
        fh.write(bytes([b ^ (0x08 if field == "flags" else 0x40)]))  # flags: the P_META bit itself
    assert not index_check.check_index(str(path))[0]
    kept, action = _kept_after_open(path, dep)
    assert action == "salvaged" and kept == {k for k, _ in items[100:]}


def _last_key_at(f, root, depth):
    """File offset of the last key of the tree under ``root`` (LMDB 0.9 nodes: key at node + 8)."""
    pg = root
    for _ in range(depth - 1):  # the last child down to the leaf
        buf = f.page(pg)
        n = (struct.unpack_from("<H", buf, 12)[0] - 16) >> 1
        o = struct.unpack_from("<H", buf, 16 + 2 * (n - 1))[0]
        lo, hi, fl = struct.unpack_from("<HHH", buf, o)
        pg = lo | hi << 16 | fl << 32
    buf = f.page(pg)
    n = (struct.unpack_from("<H", buf, 12)[0] - 16) >> 1
    return pg * f.psize + struct.unpack_from("<H", buf, 16 + 2 * (n - 1))[0] + 8


def test_a_raised_freedb_key_in_the_older_snapshot_does_not_make_it_the_newest(tmp_path):
    """The older page's trees say its txnid is its freeDB's highest key. A flip that raises that key (its parity
    kept) made the salvage take the older snapshot for the newest and bring the last commit's deletes back (found by
    the sweep above at 200 trials). Its txnid field still says older, and pairs with the newest page's: the newest
    commit is kept. The index is also damaged where the check looks (a branch pointer cut), so the open salvages."""
    path, dep, items, newest, older = _last_deleted(tmp_path)
    data = path / "data.mdb"
    f = index_walk.PageFile(str(data))
    key_at = _last_key_at(f, older["free"][7], older["free"][2])
    assert int.from_bytes(f.read(8, key_at), "little") == older["txnid"]
    db = _pages_db(f, newest)
    buf = bytearray(f.page(db[7]))
    f.close()
    with open(data, "r+b") as fh:
        fh.seek(key_at + 2)
        fh.write(b"\x60")  # txnid + 0x600000: still the older freeDB's highest key, same parity
    assert buf[10] == 0x01
    n = (struct.unpack_from("<H", buf, 12)[0] - 16) >> 1
    o = struct.unpack_from("<H", buf, 16 + 2 * (n // 2))[0]
    struct.pack_into("<HHH", buf, o, 0xFFFF, 0xFFFF, 0x7FFF)  # a child far past the end: the check fails
    _poke_page(data, db[7], buf)
    assert not index_check.check_index(str(path))[0]
    records, info = index_check.salvage_records(str(data))
    assert not {k for k, _ in items[:100]} & {k for k, _ in records}, info["problems"][:3]
    kept, action = _kept_after_open(path, dep)
    assert action == "salvaged" and kept == {k for k, _ in items[100:]}  # the cut subtree's leaves adopted


def test_an_index_with_one_commit_is_salvaged_whole(tmp_path):
    """An environment with one commit has txnid 1 on page 1 and page 0 still as LMDB created it (txnid 0): the
    pages pair as (0, 1), so its records are provable (txnid 0 is page 0's own parity)."""
    import lmdb

    path = tmp_path / "idx"
    ix, dep, items = _filled(path, 500)
    ix.close()
    records, _ = index_check.salvage_records(str(path / "data.mdb"))
    one = tmp_path / "one"
    env = lmdb.open(str(one), subdir=True, map_size=2**24, max_dbs=4)
    with env.begin(write=True) as txn:  # the DB and its records in one commit
        txn.cursor(env.open_db(b"pages", txn=txn, create=True)).putmulti(records, append=True)
    env.close()
    f = index_walk.PageFile(str(one / "data.mdb"))
    assert sorted((m["slot"], m["txnid"]) for m in index_walk.read_metas(f)) == [(0, 0), (1, 1)]
    f.close()
    again, info = index_check.salvage_records(str(one / "data.mdb"))
    assert again == records and len(again) == 500, info["problems"]


def test_when_the_metas_cannot_say_which_commit_is_newest_nothing_is_kept(tmp_path):
    """Both witnesses of a page in doubt and no consecutive pairing left: no snapshot is taken for the newest (the
    older one would bring deletes back), so nothing is kept -- misses, never a rollback."""
    path, dep, items, newest, older = _last_deleted(tmp_path)
    data = path / "data.mdb"
    f = index_walk.PageFile(str(data))
    key_at = _last_key_at(f, newest["free"][7], newest["free"][2])
    f.close()
    with open(data, "r+b") as fh:
        fh.seek(newest["slot"] * 4096 + 16 + 24 + 96 + 8)
        fh.write(struct.pack("<Q", older["txnid"] + 4))  # the field: not consecutive with the older page
        fh.seek(key_at + 2)
        fh.write(b"\x60")  # and the trees' txnid raised: neither witness pairs with the older page
    records, info = index_check.salvage_records(str(data))
    assert records == [] and any("cannot be established" in p for p in info["problems"]), info["problems"]
    kept, action = _kept_after_open(path, dep)
    assert action == "salvaged" and kept == set()


def test_a_read_only_open_refuses_a_damaged_index_and_changes_nothing(tmp_path):
    """doctor and ls open read-only: they may not replace the node's index, so they refuse with the findings and
    what a salvage would keep, and the file stays byte for byte."""
    path = tmp_path / "idx"
    ix, _, _ = _filled(path, 3000)
    ix.close()
    _flip(path / "data.mdb", 64, random.Random(3))
    before = (path / "data.mdb").read_bytes()
    with pytest.raises(IndexDamagedError, match="is damaged .*a salvage would keep") as e:
        L3Index.open(str(path), 2**24, readonly=True)
    assert e.value.findings is not None and e.value.findings.problems
    assert 0 < len(e.value.findings.records) <= 3000
    assert (path / "data.mdb").read_bytes() == before and not list(path.glob("data.mdb.damaged-*"))


KILLER = textwrap.dedent("""
    import sys, random
    from sglang_glm_ext.l3.engine.index import L3Index, IndexEntry, make_key, deployment_tag
    ix = L3Index.open(sys.argv[1], 2**24)
    dep, rng = deployment_tag("k"), random.Random(int(sys.argv[2]))
    live = []
    print("GO", flush=True)
    while True:
        if rng.random() < 0.6 or not live:
            items = [(make_key(dep, b"N" * 16, 1, rng.randbytes(32)), IndexEntry(0, 0, rng.randrange(9999), 1))
                     for _ in range(rng.randrange(1, 200))]
            ix.commit_puts(items)
            live += items
        else:
            cut = rng.randrange(len(live))
            ix.delete_if(live[cut:cut + 150])
            del live[cut:cut + 150]
        print("C", flush=True)  # one line per commit: the parent kills after a count, not after a time
""")


@pytest.mark.slow
def test_an_index_killed_mid_commit_is_never_reported_damaged(tmp_path):
    """No false alarm: SIGKILL in the middle of commits leaves a file both checks prove sound (LMDB's own crash
    safety), so a crashed server's restart keeps its whole index."""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for seed in range(6):
        p = subprocess.Popen([sys.executable, "-c", KILLER, str(tmp_path / "idx"), str(seed)], env=env,
                             stdout=subprocess.PIPE, text=True)
        try:
            assert p.stdout.readline().strip() == "GO"
            for _ in range(20 + 15 * seed):  # the kill lands after a different number of commits each run (the
                assert p.stdout.readline().strip() == "C"  # child is then inside the next commit or its print)
        finally:
            p.send_signal(signal.SIGKILL)
            p.wait()
        for mode in ("fast", "full"):
            ok, problems = index_check.check_index(str(tmp_path / "idx"), mode)
            assert ok, f"seed {seed} {mode}: {problems}"
    assert not list((tmp_path / "idx").glob("data.mdb.damaged-*"))


def test_a_process_that_has_the_index_open_keeps_it_from_being_checked_or_replaced(tmp_path):
    """Every rank of the node shares one index: only a process alone with it (LMDB's own lock) checks or repairs it;
    another process that opens it meanwhile sees it in use and leaves it as it is."""
    ix, _, _ = _filled(tmp_path / "idx", 100)
    try:
        code = textwrap.dedent("""
            import sys
            from sglang_glm_ext.l3.engine import index_check
            with index_check.guarded(sys.argv[1], timeout=5) as v:
                print(v.action)
        """)
        env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
        res = subprocess.run([sys.executable, "-c", code, str(tmp_path / "idx")], capture_output=True, text=True,
                             env=env, timeout=60)
        assert res.stdout.strip() == "in_use", res.stdout + res.stderr
    finally:
        ix.close()
    with index_check.guarded(str(tmp_path / "idx")) as v:  # alone now: it checks
        assert v.action == "verified"


def test_an_lmdb_engine_of_another_file_layout_is_refused_at_open_not_taken_for_damage(tmp_path, monkeypatch):
    """The walkers read LMDB 0.9's layout: under another engine every file would look damaged and be replaced at
    every start. Such an engine is refused with the fix instead, and the file is left alone."""
    import lmdb

    ix, _, _ = _filled(tmp_path / "idx", 100)
    ix.close()
    before = (tmp_path / "idx" / "data.mdb").read_bytes()
    monkeypatch.setattr(lmdb, "version", lambda *a: (1, 0, 0))
    with pytest.raises(OSError, match=r"LMDB 1\.0\.0 .*LMDB 0\.9's file layout.*pip install"):
        L3Index.open(str(tmp_path / "idx"), 2**24)
    assert (tmp_path / "idx" / "data.mdb").read_bytes() == before
    assert not list((tmp_path / "idx").glob("data.mdb.damaged-*"))
