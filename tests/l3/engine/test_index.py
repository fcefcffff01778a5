"""L3Index: LMDB mapping (deployment, namespace, kind, hash) -> (rank, disk, slot, last_access)."""

import os
import stat

import pytest

import l3kit
from sglang_glm_ext.l3.engine.index import IndexEntry, L3Index, deployment_tag, make_key, split_key

NS_A = b"A" * 16
NS_B = b"B" * 16


def _h(i):
    return i.to_bytes(32, "big")


@pytest.fixture
def idx(tmp_path):
    ix = L3Index.open(str(tmp_path / "idx"), 16 * 2**20)
    yield ix
    ix.close()


def test_files_and_dir_are_owner_only(tmp_path, idx):
    p = tmp_path / "idx"
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o700
    for name in ("data.mdb", "lock.mdb"):
        assert stat.S_IMODE(os.stat(p / name).st_mode) == 0o600


def test_put_get_many_prefix(idx):
    dep = deployment_tag("d")
    keys = [make_key(dep, NS_A, 1, _h(i)) for i in range(5)]
    for i in (0, 1, 2, 4):
        assert idx.put(keys[i], IndexEntry(0, 0, i, 10 + i))
    got = idx.get_many(keys)
    assert got[3] is None and got[4] == IndexEntry(0, 0, 4, 14)
    assert idx.prefix_len(keys) == 3  # stops at the first miss even though key 4 exists
    assert split_key(keys[2]) == (dep, NS_A, 1, _h(2))


def test_commit_puts_is_insert_if_absent(idx):
    dep = deployment_tag("d")
    k = make_key(dep, NS_A, 1, _h(1))
    assert idx.commit_puts([(k, IndexEntry(0, 0, 5, 1))]) == [None]
    res = idx.commit_puts([(k, IndexEntry(1, 0, 7, 2)), (make_key(dep, NS_A, 1, _h(2)), IndexEntry(1, 0, 8, 2))])
    assert res[0] == IndexEntry(0, 0, 5, 1) and res[1] is None
    assert idx.get(k).slot == 5  # the first writer keeps the entry


def test_delete_if_is_conditional_on_location(idx):
    dep = deployment_tag("d")
    k = make_key(dep, NS_A, 1, _h(1))
    idx.put(k, IndexEntry(1, 0, 9, 100))
    assert idx.delete_if([(k, IndexEntry(0, 0, 9, 100))]) == [False]  # other rank
    assert idx.delete_if([(k, IndexEntry(1, 0, 9, 50))], newer_than_wins=True) == [IndexEntry(1, 0, 9, 100)]
    assert idx.get(k) is not None
    assert idx.delete_if([(k, IndexEntry(1, 0, 9, 100))]) == [True]
    assert idx.get(k) is None


def test_touch_only_raises_last_access(idx):
    k = make_key(deployment_tag("d"), NS_A, 1, _h(1))
    idx.put(k, IndexEntry(0, 0, 1, 100))
    idx.touch_many([(k, 50)])
    assert idx.get(k).last_access == 100
    idx.touch_many([(k, 200), (make_key(deployment_tag("d"), NS_A, 1, _h(9)), 300)])
    assert idx.get(k).last_access == 200
    assert idx.count() == 1  # touching an absent key never creates it


def test_delete_for_touches_only_this_deployment_and_rank(idx):
    d1, d2 = deployment_tag("one"), deployment_tag("two")
    for dep in (d1, d2):
        for ns in (NS_A, NS_B):
            for rank in (0, 1):
                for i in range(3):
                    idx.put(make_key(dep, ns, 1, _h(rank * 10 + i)), IndexEntry(rank, 0, i, 1))
    assert idx.count() == 24
    assert len(list(idx.iter_rank(d1, 0, NS_A))) == 3
    assert idx.delete_for(d1, 0, keep_ns=NS_A) == 3  # only d1 / rank 0 / namespace B
    assert idx.delete_for(d1, 0) == 3
    assert idx.count() == 18
    assert all(e.rank == 1 for _, e in idx.iter_prefix(d1))
    assert len(list(idx.iter_prefix(d2))) == 12


def test_map_full_is_a_counted_false_not_a_crash(tmp_path):
    ix = L3Index.open(str(tmp_path / "small"), 2**20)  # 1 MiB map: a few thousand entries
    dep = deployment_tag("d")
    ok = 0
    for b in range(1000):
        res = ix.commit_puts([(make_key(dep, NS_A, 1, _h(b * 100 + j)), IndexEntry(0, 0, j, 1)) for j in range(100)])
        if res is None:
            break
        ok += 100
    assert 0 < ok < 100_000 and ix.index_full == 100  # the whole refused batch counted, nothing of it stored
    assert ix.get(make_key(dep, NS_A, 1, _h(ok))) is None
    # Single puts fill what the batch could not, then fail the same way.
    singles = [ix.put(make_key(dep, NS_A, 1, _h(10**7 + j)), IndexEntry(0, 0, 1, 1)) for j in range(100)]
    assert singles[-1] is False and ix.index_full == 100 + singles.count(False)
    # Existing entries stay readable after the failures.
    assert ix.get(make_key(dep, NS_A, 1, _h(0))) is not None
    ix.close()


def test_sizing_bytes_per_entry(tmp_path):
    """Sizing figure for docs_internal/l3_design.md: B-tree bytes per entry with random 32-byte hashes."""
    ix = L3Index.open(str(tmp_path / "size"), 256 * 2**20)
    dep = deployment_tag("d")
    n = 50_000
    for i in range(0, n, 5000):
        ix.commit_puts([(make_key(dep, NS_A, 1, os.urandom(32)), IndexEntry(0, 0, j, j)) for j in range(i, i + 5000)])
    per = ix.stat()["bytes_used"] / n
    assert 80 <= per <= 250, per  # 57 B key + 16 B value + node overhead, B-tree fill ~ 50-100 %
    ix.close()


# ---------------------------------------------------------------------------------------------------------------
# Issue 7, item 4, and issue 24, item 2: a truncated data.mdb never kills the process that opens it (LMDB maps the
# file: a page past EOF is SIGBUS). Before issue 24 the open refused it; now the node's first open proves the file
# before mapping it, and a damaged one is moved aside and replaced by what can be proven (engine/index_check.py; a
# read-only open still refuses and changes nothing). Run in a subprocess, so a signal shows as a failed test
# instead of a dead pytest.
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import textwrap  # noqa: E402

REPO = str(l3kit.REPO)

_TRUNC_CHILD = textwrap.dedent("""
    import json, sys
    which, path = sys.argv[1], sys.argv[2]
    if which == "index":
        from sglang_glm_ext.l3.engine.index import IndexDamagedError, L3Index
        try:
            ix = L3Index.open(path, 2**24)
        except OSError as e:
            print("REFUSED", type(e).__name__, e, flush=True)
            sys.exit(0)
        # Opened: the data path must still not fault.
        n = len(list(ix.iter_prefix(b"")))
        ix.get_many([bytes(57)] * 10)
        print("OPENED", n, flush=True)
    elif which == "index_ro_then_rw":
        from sglang_glm_ext.l3.engine.index import IndexDamagedError, L3Index
        try:
            L3Index.open(path, 2**24, readonly=True).close()
            print("RO_OPENED", flush=True)
        except IndexDamagedError as e:
            print("RO_REFUSED", len(e.findings.records) if e.findings else None, flush=True)
        ix = L3Index.open(path, 2**24)
        items = [(k.hex(), e.slot) for k, e in ix.scan(b"").items]
        ix.get_many([bytes(57)] * 10)
        v = ix.verdict
        print("OPENED", json.dumps({"action": v.action, "kept": v.kept, "moved_to": v.moved_to, "items": items}),
              flush=True)
    else:
        from sglang_glm_ext.l3.config import L3Config
        from sglang_glm_ext.l3.disk.format import Namespace, PayloadKind
        from sglang_glm_ext.l3.engine.store import L3Store, L3StoreError
        cfg = L3Config.from_file(path)
        try:
            s = L3Store.open(cfg, rank=0, namespace=Namespace("m", "bf16", "page_first", 64, 0, 1, "tp0"),
                             page_bytes={PayloadKind.TARGET_KV: 4096}, cold_start="load")
        except L3StoreError as e:
            print("REFUSED", type(e).__name__, e, flush=True)
            sys.exit(0)
        st = s.stats()
        print("OPENED", s.exists(PayloadKind.TARGET_KV, ["00" * 32]), st["index_check"], st["index_repaired"],
              st["index_salvage_kept"], st["index_moved_to"], flush=True)
        s.close()
""")


def _fill_index(path, n=20000):
    ix = L3Index.open(str(path), 2**24)
    dep = deployment_tag("t")
    for b in range(0, n, 5000):
        ix.commit_puts([(make_key(dep, NS_A, 1, _h(i)), IndexEntry(0, 0, i, 1)) for i in range(b, b + 5000)])
    ix.close()
    return os.path.getsize(path / "data.mdb")


def _run_child(tmp_path, which, target):
    script = tmp_path / "trunc_child.py"
    script.write_text(_TRUNC_CHILD)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, str(script), which, str(target)], capture_output=True, text=True,
                          env=env, timeout=60)


def _assert_alive(res):
    assert res.returncode == 0, f"child died with {res.returncode} (SIGBUS is -7): {res.stderr[-2000:]}"


def test_a_truncated_index_never_kills_the_store_open_it_is_moved_aside_and_what_is_proven_is_kept(tmp_path):
    """Was: refused at store open (no L3 for the node until an operator moved the file). Now the store opens: the cut
    file is kept aside for the operator, byte for byte, and the new index holds exactly what the salvage proves of
    it (a cut loses the newest pages, the committed trees' roots and free list, so here nothing is provable: a freed
    leaf in what remains could hold deleted entries, and none is trusted)."""
    from sglang_glm_ext.l3.engine import index_check

    size = _fill_index(tmp_path / "index")
    os.truncate(tmp_path / "index" / "data.mdb", size // 2)
    cfg = tmp_path / "l3.toml"
    cfg.write_text(f'deployment_id = "t"\n[[disks]]\npath = "{tmp_path}/disk"\nbudget = "1MiB"\n'
                   f'[index]\npath = "{tmp_path}/index"\nmap_size = "16MiB"\n')
    res = _run_child(tmp_path, "store", cfg)
    _assert_alive(res)
    out = res.stdout.split()
    assert out[:4] == ["OPENED", "0", "salvaged", "1"], res.stdout + res.stderr[-2000:]
    kept, moved = int(out[4]), out[5]
    assert os.path.dirname(moved) == str(tmp_path / "index") and os.path.basename(moved).startswith("data.mdb.damaged-")
    assert os.path.getsize(moved) == size // 2  # the damaged file itself, untouched
    assert kept == len(index_check.salvage_records(moved)[0])
    assert "was damaged" in res.stderr and moved in res.stderr  # the one error line an operator sees


@pytest.mark.slow
@pytest.mark.parametrize("cut", ["half", "two_pages_and_a_bit", "one_page_and_a_bit", "all_but_one_page"])
def test_every_truncation_of_the_index_is_moved_aside_never_a_signal_and_keeps_only_proven_entries(tmp_path, cut):
    """Every cut, from inside the metas to the last page: a read-only open (doctor, ls) refuses it and changes
    nothing; the read-write open never dies, moves it aside, and keeps exactly what the salvage proves -- entries
    the file really held, never one it did not."""
    from sglang_glm_ext.l3.engine import index_check

    size = _fill_index(tmp_path / "index")
    new = {"half": size // 2, "two_pages_and_a_bit": 2 * 4096 + 100, "one_page_and_a_bit": 4096 + 1904,
           "all_but_one_page": size - 4096}[cut]
    os.truncate(tmp_path / "index" / "data.mdb", new)
    res = _run_child(tmp_path, "index_ro_then_rw", tmp_path / "index")
    _assert_alive(res)
    lines = res.stdout.splitlines()
    assert lines[0].startswith("RO_REFUSED"), res.stdout + res.stderr[-2000:]
    assert lines[1].startswith("OPENED "), res.stdout
    got = json.loads(lines[1][len("OPENED "):])
    assert got["action"] == "salvaged" and os.path.getsize(got["moved_to"]) == new
    proven = {k.hex(): IndexEntry.unpack(v).slot for k, v in index_check.salvage_records(got["moved_to"])[0]}
    assert dict((k, slot) for k, slot in got["items"]) == proven and got["kept"] == len(proven)
    original = {make_key(deployment_tag("t"), NS_A, 1, _h(i)).hex(): i for i in range(20000)}
    assert all(original.get(k) == slot for k, slot in proven.items())


def test_an_intact_index_still_opens_and_an_empty_file_is_a_new_index(tmp_path):
    _fill_index(tmp_path / "index", n=5000)
    res = _run_child(tmp_path, "index", tmp_path / "index")
    assert res.returncode == 0 and res.stdout.split() == ["OPENED", "5000"], res.stdout + res.stderr
    # Zero bytes is what LMDB itself treats as a new environment (and what a crash during the very first
    # creation leaves): it opens empty; the slabs' pages are then unreferenced, i.e. misses, never wrong bytes.
    os.truncate(tmp_path / "index" / "data.mdb", 0)
    res = _run_child(tmp_path, "index", tmp_path / "index")
    assert res.returncode == 0 and res.stdout.split() == ["OPENED", "0"], res.stdout + res.stderr


# ---------------------------------------------------------------------------------------------------------------
# Issue 7, item 5: one damaged key (a flipped byte in a leaf page) must not end a prefix scan. LMDB walks leaves
# in page order, so a damaged key shows up out of sorted order in the middle of a range.
import re  # noqa: E402


def _raw_keys(ix):
    """Every record in page order (a cursor walk compares no keys, so damage cannot hide a record from it)."""
    with ix.env.begin(db=ix.db) as txn:
        return [(bytes(k), bytes(v)) for k, v in txn.cursor()]


def _damage_key(index_dir, key, pos, new_byte):
    """Overwrite byte ``pos`` of ``key`` wherever the key's bytes appear in data.mdb (leaf, branch, old copies)."""
    path = index_dir / "data.mdb"
    raw = path.read_bytes()
    hits = [m.start() for m in re.finditer(re.escape(key), raw)]
    assert hits
    with open(path, "r+b") as f:
        for off in hits:
            f.seek(off + pos)
            f.write(bytes([new_byte]))
    return key[:pos] + bytes([new_byte]) + key[pos + 1:]


def _populate(index_dir, n=300):
    ix = L3Index.open(str(index_dir), 2**24)
    mine = {}
    for dep in ("a", "d", "z"):
        tag = deployment_tag(dep)
        items = [(make_key(tag, NS_A, 1, _h(i)), IndexEntry(i % 2, 0, i, 1)) for i in range(n)]
        assert ix.commit_puts(items) == [None] * n
        if dep == "d":
            mine = dict(items)
    ix.close()
    return mine


@pytest.mark.parametrize("where", ["first", "middle", "last"])
@pytest.mark.parametrize("damage", ["tag_up", "tag_down", "hash"])
def test_a_damaged_key_never_ends_a_prefix_scan(tmp_path, where, damage, monkeypatch):
    """The scan's own damage tolerance: the second line, for a page damaged while the node's processes have the
    index open (the guard proves the file at the node's first open only). Opened here without the guard
    (test-only), so the damage reaches the scan as it would then."""
    import shutil

    from sglang_glm_ext.l3.engine import index as index_mod

    mine = _populate(tmp_path / "idx")
    ordered = sorted(mine)
    victim = ordered[{"first": 0, "middle": len(ordered) // 2, "last": -1}[where]]
    pos, byte = {"tag_up": (0, 0xFF), "tag_down": (0, 0x00), "hash": (40, victim[40] ^ 0x5A)}[damage]
    if victim[pos] == byte:
        byte ^= 0x01
    damaged = _damage_key(tmp_path / "idx", victim, pos, byte)
    shutil.copytree(tmp_path / "idx", tmp_path / "guarded")
    tag = deployment_tag("d")
    monkeypatch.setattr(index_mod, "_UNGUARDED_FOR_TESTS", True)
    ix = L3Index.open(str(tmp_path / "idx"), 2**24)
    try:
        want = {k: e for k, e in mine.items() if k != victim}
        if damaged.startswith(tag):
            want[damaged] = mine[victim]  # still inside the range: reported, under its damaged key
        scan = ix.scan(tag)
        assert dict(scan.items) == want
        physical = [k for k, _ in _raw_keys(ix)]
        if physical != sorted(physical):  # a flip that keeps the order (first key lowered...) is harmless
            assert scan.damaged >= 1 and scan.full_walk  # the walk noticed the break and walked everything
        assert dict(ix.iter_prefix(tag)) == want
        # delete_for removes every entry of the rank, including those a search can no longer find in the damaged
        # page; nothing of another deployment or rank is touched.
        rank0 = {k for k, e in want.items() if e.rank == 0}
        assert ix.delete_for(tag, 0) == len(rank0)
        left = dict(_raw_keys(ix))
        assert not rank0 & set(left)
        assert {k for k, e in want.items() if e.rank == 1} <= set(left)
        assert sum(1 for k in left if k.startswith(deployment_tag("a"))) == 300
        assert sum(1 for k in left if k.startswith(deployment_tag("z"))) == 300
    finally:
        ix.close()
    monkeypatch.setattr(index_mod, "_UNGUARDED_FOR_TESTS", False)
    # The node's first open (the guard): a file the check refuses is moved aside, and what the salvage proves is
    # kept -- every undamaged entry of every deployment; the damaged one is dropped (it broke its leaf's order or
    # its parent's bounds), or kept, under its damaged key, only where the file proved sound as it is.
    ix = L3Index.open(str(tmp_path / "guarded"), 2**24)
    try:
        records = dict(_raw_keys(ix))
        assert list(records) == sorted(records)  # whatever survived, the index is a sound B-tree again
        aside = list((tmp_path / "guarded").glob("data.mdb.damaged-*"))
        assert (ix.verdict.action == "salvaged") == bool(aside) and ix.verdict.action in ("salvaged", "verified")
        ours = {k: IndexEntry.unpack(v) for k, v in records.items() if k.startswith(tag)}
        assert {k: e for k, e in ours.items() if k != damaged} == {k: e for k, e in mine.items() if k != victim}
        if damaged in records:
            assert IndexEntry.unpack(records[damaged]) == mine[victim]
        others = {k for k in records if k.startswith((deployment_tag("a"), deployment_tag("z")))}
        assert len(others) == 600 and set(records) - set(ours) - others <= {damaged}
        # The salvage drops it wherever it broke an order or a bound; where the flip kept its place (the first key
        # lowered, the last key's hash byte raised) the file is sound as it is and it is kept.
        assert (damaged in records) == (ix.verdict.action == "verified")
    finally:
        ix.close()


def test_an_intact_index_is_scanned_without_a_full_walk(tmp_path):
    mine = _populate(tmp_path / "idx")
    ix = L3Index.open(str(tmp_path / "idx"), 2**24)
    try:
        scan = ix.scan(deployment_tag("d"))
        assert dict(scan.items) == mine and scan.damaged == 0 and not scan.full_walk
        assert ix.scan(deployment_tag("nobody")).items == []
    finally:
        ix.close()


# ---------------------------------------------------------------------------------------------------------------
# Issue 7, found by reading: a SIGKILLed rank leaves its LMDB reader slot behind. While other ranks keep the
# environment open LMDB does not reset its reader table, and a stale reader pins an old snapshot (no page it
# could see is ever reused: the file grows towards map full) and holds one of max_readers slots.
_READER_CHILD = textwrap.dedent("""
    import sys
    from sglang_glm_ext.l3.engine.index import L3Index
    ix = L3Index.open(sys.argv[1], 2**24)
    txn = ix.env.begin()
    txn.get(b"k" * 57)
    print("READING", flush=True)
    sys.stdin.read()  # inside its read transaction until killed (or until the test is gone: its stdin closes)
""")


def _reader_pids(ix):
    rows = ix.env.readers().splitlines()[1:]
    return {int(r.split()[0]) for r in rows if r.strip()}


def test_the_reader_slot_of_a_killed_rank_is_cleared_when_a_store_opens(tmp_path):
    import signal
    import threading

    from sglang_glm_ext.l3.config import L3Config
    from sglang_glm_ext.l3.disk.format import Namespace, PayloadKind
    from sglang_glm_ext.l3.engine.store import L3Store

    live = L3Index.open(str(tmp_path / "index"), 2**24)  # another rank that stays up the whole time
    script = tmp_path / "reader.py"
    script.write_text(_READER_CHILD)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "index")], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    guard = threading.Timer(120, proc.kill)  # a hang guard: a child silent this long is killed, ending the read
    guard.start()
    try:
        line = proc.stdout.readline()
        guard.cancel()
        assert line.strip() == "READING", proc.stderr.read()
        assert proc.pid in _reader_pids(live)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        assert proc.pid in _reader_pids(live)  # LMDB keeps the dead reader while others have the env open
        cfg = L3Config.from_dict({"deployment_id": "t", "disks": [{"path": str(tmp_path / "disk"), "budget": "1MiB"}],
                                  "index": {"path": str(tmp_path / "index"), "map_size": 2**24}})
        s = L3Store.open(cfg, rank=0, namespace=Namespace("m", "bf16", "page_first", 64, 0, 1, "tp0"),
                         page_bytes={PayloadKind.TARGET_KV: 4096})
        try:
            assert proc.pid not in _reader_pids(live)
            assert s.index.stale_readers_cleared >= 1
        finally:
            s.close()
    finally:
        guard.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        live.close()


def test_a_key_is_built_and_read_only_through_named_fields():
    from sglang_glm_ext.l3.disk.format import PayloadKind
    from sglang_glm_ext.l3.engine.index import IndexKey, KeySpace

    dep, h = deployment_tag("d"), _h(7)
    space = KeySpace(dep, NS_A)
    key = space.key(PayloadKind.INDEX_K, h)
    assert key == make_key(dep, NS_A, PayloadKind.INDEX_K, h) == space.prefix(PayloadKind.INDEX_K) + h
    parts = split_key(key)
    assert isinstance(parts, IndexKey) and parts.pack() == key
    assert (parts.deployment, parts.namespace, parts.content_hash) == (dep, NS_A, h)
    assert parts.kind == 3 and parts.payload_kind is PayloadKind.INDEX_K
    assert split_key(make_key(dep, NS_A, 200, h)).payload_kind is None  # a byte no version defines
