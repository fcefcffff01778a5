"""engine/index_check.py through its public API: ``check_index`` (a sound index passes, any other bytes fail without
raising), ``salvage_records`` (exactly the records a bounded walk can prove, never one the file did not hold),
``rebuild_index`` (the fresh index holds exactly the records given, the damaged file is kept aside, nothing is
half-replaced) and ``guarded`` (the node's first open: new / verified / in_use / salvaged / reset, or Damaged
under ``refuse``; the gate held for the block).

The random-flip sweeps and the salvage's individual rules (freed leaves, orphans, meta txnids) are in
test_index_bitrot.py; the store-level open in test_index.py. Here every expected record set is derived from what
the test wrote and which bytes it damaged, read with the test's own LMDB page parser.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import importlib.util
import os
import struct
import subprocess
import sys

import pytest

from sglang_glm_ext.l3.engine.index import IndexEntry, L3Index, deployment_tag, make_key
from sglang_glm_ext.l3.engine.index_check import (CHECK_MODES, GATE_FILE, ON_DAMAGE, Damaged, Verdict, check_index,
                                                  guarded, rebuild_index, salvage_records)

PSIZE = 4096
NS = b"N" * 16
HAVE_VERIFY = importlib.util.find_spec("lmdb.verify") is not None


def _items(n, salt=0):
    dep = deployment_tag("t")
    return [(make_key(dep, NS, 1, (salt * 10**6 + i).to_bytes(32, "big")), IndexEntry(i % 3, 0, i, 1000 + i))
            for i in range(n)]


def _index(path, n, *, batch=None) -> dict:
    """An index of ``n`` entries written by the engine; returns {key: packed value}."""
    items = _items(n)
    ix = L3Index.open(str(path), 2**24)
    try:
        step = batch or max(n, 1)
        for b in range(0, n, step):
            assert ix.commit_puts(items[b:b + step]) == [None] * len(items[b:b + step])
    finally:
        ix.close()
    return {k: e.pack() for k, e in items}


def _data(path):
    return os.path.join(str(path), "data.mdb")


def _leaves_of_57_byte_keys(data_path) -> "dict[int, list[bytes]]":
    """The test's own parse of LMDB 0.9 pages: every leaf page (flags 0x02) whose nodes carry 57-byte keys, with
    its keys."""
    raw = open(data_path, "rb").read()
    out = {}
    for pg in range(2, len(raw) // PSIZE):
        buf = raw[pg * PSIZE:(pg + 1) * PSIZE]
        stored, _pad, flags, lower, _upper = struct.unpack_from("<QHHHH", buf, 0)
        if stored != pg or flags & ~0x10 != 0x02:
            continue
        keys = []
        for i in range((lower - 16) // 2):
            o = struct.unpack_from("<H", buf, 16 + 2 * i)[0]
            ks = struct.unpack_from("<H", buf, o + 6)[0]
            keys.append(buf[o + 8:o + 8 + ks])
        if keys and all(len(k) == 57 for k in keys):
            out[pg] = keys
    return out


def _live_leaves(data_path, want_keys) -> "dict[int, list[bytes]]":
    """Leaves of the pages DB, asserted to be exactly the committed tree's (each key on one leaf; no old copy)."""
    leaves = _leaves_of_57_byte_keys(data_path)
    flat = [k for keys in leaves.values() for k in keys]
    assert len(flat) == len(set(flat)) and set(flat) == set(want_keys), "set-up: stale leaf copies in the file"
    return leaves


def _scan(path) -> dict:
    ix = L3Index.open(str(path), 2**24)
    try:
        return {k: e.pack() for k, e in ix.scan(b"").items}
    finally:
        ix.close()


# ------------------------------------------------------------------------------------------------ check_index
@pytest.mark.parametrize("mode", CHECK_MODES)
def test_a_sound_index_passes_the_check(tmp_path, mode):
    if mode == "full" and not HAVE_VERIFY:
        pytest.skip("this py-lmdb has no lmdb.verify")
    _index(tmp_path / "idx", 3000, batch=700)  # several commits: a free list, older copies of pages
    assert check_index(str(tmp_path / "idx"), mode) == (True, [])


def test_an_unknown_check_mode_is_refused(tmp_path):
    _index(tmp_path / "idx", 10)
    with pytest.raises(ValueError, match="'thorough'"):
        check_index(str(tmp_path / "idx"), "thorough")
    with pytest.raises(ValueError, match="'thorough'"):
        with guarded(str(tmp_path / "idx"), check="thorough"):
            pass
    with pytest.raises(ValueError, match="'ignore'"):
        with guarded(str(tmp_path / "idx"), on_damage="ignore"):
            pass


def test_a_check_that_cannot_read_the_file_concludes_nothing(tmp_path):
    (tmp_path / "idx").mkdir()
    with pytest.raises(OSError):
        check_index(str(tmp_path / "idx"))  # no data.mdb: an operational error, not a verdict
    with pytest.raises(OSError):
        salvage_records(_data(tmp_path / "idx"))


def _damage(kind, data_path):
    size = os.path.getsize(data_path)
    if kind == "empty":
        os.truncate(data_path, 0)
    elif kind == "inside_the_metas":
        os.truncate(data_path, 100)
    elif kind == "half":
        os.truncate(data_path, size // 2)
    elif kind == "last_page_cut":
        os.truncate(data_path, size - PSIZE // 2)
    elif kind == "zeros":
        with open(data_path, "r+b") as f:
            f.write(bytes(size))
    elif kind == "noise":  # fixed bytes: the same damage on every run
        with open(data_path, "r+b") as f:
            f.write(hashlib.shake_256(b"noise").digest(size))
    elif kind == "meta_page_noise":
        with open(data_path, "r+b") as f:
            f.seek(PSIZE + 16)
            f.write(hashlib.shake_256(b"meta").digest(200))


@pytest.mark.parametrize("kind", ["empty", "inside_the_metas", "half", "last_page_cut", "zeros", "noise",
                                  "meta_page_noise"])
def test_damaged_bytes_fail_the_check_and_the_salvage_invents_nothing(tmp_path, kind):
    """Never raises for any content; whatever the salvage keeps is a record the file held, with its value."""
    held = _index(tmp_path / "idx", 2000, batch=500)
    _damage(kind, _data(tmp_path / "idx"))
    ok, problems = check_index(str(tmp_path / "idx"))
    assert not ok and problems and all(isinstance(p, str) for p in problems)
    records, info = salvage_records(_data(tmp_path / "idx"))
    assert all(held.get(k) == v for k, v in records)
    assert records == sorted(set(records)) and info["problems"]


def test_a_wrong_entry_count_is_damage_even_where_every_page_is_sound(tmp_path):
    """The pages DB record's entry count (LMDB sizes cursor stacks by its counters) against what the walk found:
    off by seven fails the check; the salvage still keeps every record, and reports the count the file claimed."""
    held = _index(tmp_path / "idx", 500)
    data = _data(tmp_path / "idx")
    raw = bytearray(open(data, "rb").read())
    node = struct.pack("<HHHH", 48, 0, 0x02, 5) + b"pages"  # a 48-byte sub-DB record keyed "pages"
    patched = 0
    at = raw.find(node)
    while at >= 0:
        entries_at = at + len(node) + 32  # pad, flags, depth, branch, leaf, overflow, then entries
        if struct.unpack_from("<Q", raw, entries_at)[0] == len(held):
            struct.pack_into("<Q", raw, entries_at, len(held) + 7)
            patched += 1
        at = raw.find(node, at + 1)
    assert patched, "set-up: the pages DB record was not found"
    open(data, "wb").write(raw)
    ok, problems = check_index(str(tmp_path / "idx"))
    assert not ok and any("pages DB record says" in p for p in problems), problems
    records, info = salvage_records(data)
    assert dict(records) == held and info["claimed"] == len(held) + 7


# ------------------------------------------------------------------------------------------------ salvage_records
def test_the_salvage_of_a_sound_index_is_every_record_sorted(tmp_path):
    held = _index(tmp_path / "idx", 2500, batch=600)
    records, info = salvage_records(_data(tmp_path / "idx"))
    assert records == sorted(held.items())
    assert (info["claimed"], info["walked"], info["adopted"], info["problems"]) == (2500, 2500, 0, [])
    counted, info = salvage_records(_data(tmp_path / "idx"), collect=False)  # the check's walk: counts only
    assert counted == [] and info["walked"] == 2500 and info["problems"] == []


def test_an_empty_pages_db_salvages_to_nothing_and_passes(tmp_path):
    _index(tmp_path / "idx", 0)
    assert check_index(str(tmp_path / "idx")) == (True, [])
    records, info = salvage_records(_data(tmp_path / "idx"))
    assert records == [] and info["claimed"] == 0 and info["problems"] == []


def test_a_zeroed_leaf_costs_exactly_its_own_records(tmp_path):
    held = _index(tmp_path / "idx", 2000)  # one commit: every 57-byte-key leaf in the file is live
    data = _data(tmp_path / "idx")
    leaves = _live_leaves(data, held)
    assert len(leaves) >= 3
    victim = sorted(leaves)[len(leaves) // 2]
    with open(data, "r+b") as f:
        f.seek(victim * PSIZE)
        f.write(bytes(PSIZE))
    ok, problems = check_index(str(tmp_path / "idx"))
    assert not ok and any(f"page {victim}" in p for p in problems), problems
    records, info = salvage_records(data)
    lost = set(leaves[victim])
    assert dict(records) == {k: v for k, v in held.items() if k not in lost}
    assert info["claimed"] == 2000


# ------------------------------------------------------------------------------------------------ rebuild_index
def test_rebuild_writes_exactly_the_records_given_and_keeps_the_old_file_aside(tmp_path):
    held = _index(tmp_path / "idx", 800)
    data = _data(tmp_path / "idx")
    old_bytes = open(data, "rb").read()
    keep = sorted(held.items())[::3]
    aside = str(tmp_path / "idx" / "data.mdb.aside")
    rebuild_index(str(tmp_path / "idx"), keep, 2**24, aside)
    assert open(aside, "rb").read() == old_bytes
    assert check_index(str(tmp_path / "idx")) == (True, [])  # the server's own flags: the check accepts it
    assert salvage_records(data)[0] == keep
    assert _scan(tmp_path / "idx") == dict(keep)
    assert sorted(set(os.listdir(tmp_path / "idx")) - {GATE_FILE}) == ["data.mdb", "data.mdb.aside", "lock.mdb"]


def test_a_rebuild_that_cannot_be_written_leaves_the_old_file_in_place(tmp_path):
    held = _index(tmp_path / "idx", 20000, batch=5000)
    data = _data(tmp_path / "idx")
    old_bytes = open(data, "rb").read()
    aside = str(tmp_path / "idx" / "data.mdb.aside")
    with pytest.raises(Exception) as exc:  # 20,000 records do not fit the 1 MiB floor of the map
        rebuild_index(str(tmp_path / "idx"), sorted(held.items()), 1, aside)
    assert "MapFull" in type(exc.value).__name__
    assert open(data, "rb").read() == old_bytes and not os.path.exists(aside)
    assert sorted(set(os.listdir(tmp_path / "idx")) - {GATE_FILE}) == ["data.mdb", "lock.mdb"]


# ------------------------------------------------------------------------------------------------ guarded
def test_no_data_yet_is_a_new_index(tmp_path):
    (tmp_path / "idx").mkdir()
    with guarded(str(tmp_path / "idx")) as v:
        assert (v.action, v.repaired) == ("new", False)
    open(_data(tmp_path / "idx"), "wb").close()  # zero bytes: LMDB's own "new environment"
    with guarded(str(tmp_path / "idx")) as v:
        assert v.action == "new"


def test_a_sound_index_is_verified_and_left_as_it_is(tmp_path):
    _index(tmp_path / "idx", 300)
    before = open(_data(tmp_path / "idx"), "rb").read()
    with guarded(str(tmp_path / "idx")) as v:
        assert (v.action, v.repaired, v.kept, v.moved_to) == ("verified", False, 0, "")
        assert v.as_dict()["action"] == "verified" and "check" in v.seconds
    assert open(_data(tmp_path / "idx"), "rb").read() == before
    assert not [n for n in os.listdir(tmp_path / "idx") if n.startswith("data.mdb.damaged-")]


def test_the_gate_is_held_until_the_block_ends(tmp_path):
    _index(tmp_path / "idx", 10)
    gate = os.path.join(str(tmp_path / "idx"), GATE_FILE)
    with guarded(str(tmp_path / "idx")):
        fd = os.open(gate, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):  # another process's first open waits here
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    fd = os.open(gate, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released with the block
    finally:
        os.close(fd)


def test_a_gate_held_past_the_timeout_is_an_error_and_nothing_is_touched(tmp_path):
    _index(tmp_path / "idx", 10)
    _damage("half", _data(tmp_path / "idx"))  # damaged: a check that ran would move it aside
    fd = os.open(os.path.join(str(tmp_path / "idx"), GATE_FILE), os.O_RDWR | os.O_CREAT, 0o600)
    before = {n: open(os.path.join(str(tmp_path / "idx"), n), "rb").read() for n in os.listdir(tmp_path / "idx")}
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another process is checking the index
        with pytest.raises(OSError) as exc:
            with guarded(str(tmp_path / "idx"), timeout=0):
                pass
        assert exc.value.errno == errno.ETIMEDOUT and GATE_FILE in str(exc.value)
    finally:
        os.close(fd)
    after = {n: open(os.path.join(str(tmp_path / "idx"), n), "rb").read() for n in os.listdir(tmp_path / "idx")}
    assert after == before


_HOLDER = """
import sys, lmdb
env = lmdb.open(sys.argv[1], subdir=True, max_dbs=4, lock=True, map_size=2**24)
print("open", flush=True)
sys.stdin.readline()
env.close()
"""


def test_an_index_live_processes_have_open_is_not_checked_again(tmp_path):
    """Whether anybody has the environment open is LMDB's own lock on lock.mdb, whatever its opener (here a plain
    py-lmdb process): the first of them proved the file, and it cannot be replaced under their maps."""
    _index(tmp_path / "idx", 50)
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(tmp_path / "idx")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open", holder.stderr.read()
        with guarded(str(tmp_path / "idx")) as v:
            assert v.action == "in_use"
    finally:
        holder.communicate("\n", timeout=60)
    assert holder.returncode == 0
    with guarded(str(tmp_path / "idx")) as v:  # nobody has it open any more: this opener checks it
        assert v.action == "verified"


def _damaged_index(tmp_path, n=2000):
    """An index with one live leaf zeroed: (path, what it held, what a salvage keeps)."""
    held = _index(tmp_path / "idx", n)
    data = _data(tmp_path / "idx")
    leaves = _live_leaves(data, held)
    victim = sorted(leaves)[1]
    with open(data, "r+b") as f:
        f.seek(victim * PSIZE)
        f.write(bytes(PSIZE))
    keep = {k: v for k, v in held.items() if k not in set(leaves[victim])}
    return tmp_path / "idx", held, keep


def test_a_damaged_index_is_salvaged_moved_aside_and_replaced_by_what_is_proven(tmp_path):
    path, held, keep = _damaged_index(tmp_path)
    damaged = open(_data(path), "rb").read()
    with guarded(str(path)) as v:
        assert (v.action, v.repaired, v.kept, v.claimed) == ("salvaged", True, len(keep), len(held))
        assert v.problems and v.reason
        assert os.path.dirname(v.moved_to) == str(path)
        assert os.path.basename(v.moved_to).startswith("data.mdb.damaged-") and v.moved_to.endswith(f"-{os.getpid()}")
        moved = v.moved_to
    assert open(moved, "rb").read() == damaged  # kept for the operator, byte for byte
    assert check_index(str(path)) == (True, [])
    assert _scan(path) == keep


def test_reset_replaces_a_damaged_index_with_an_empty_one(tmp_path):
    path, held, _ = _damaged_index(tmp_path)
    with guarded(str(path), on_damage="reset") as v:
        assert (v.action, v.repaired, v.kept, v.claimed) == ("reset", True, 0, len(held))
        assert os.path.exists(v.moved_to)
    assert check_index(str(path)) == (True, [])
    assert _scan(path) == {}


def test_refuse_changes_nothing_and_says_what_a_salvage_would_keep(tmp_path):
    path, held, keep = _damaged_index(tmp_path)
    before = {n: open(os.path.join(str(path), n), "rb").read() for n in ("data.mdb",)}
    with pytest.raises(Damaged) as exc:
        with guarded(str(path), on_damage="refuse"):
            pytest.fail("the block must not run on a damaged index under refuse")
    d = exc.value
    assert isinstance(d, OSError) and d.problems and d.reason
    assert dict(d.records) == keep and d.claimed == len(held)
    assert {n: open(os.path.join(str(path), n), "rb").read() for n in before} == before
    assert not [n for n in os.listdir(path) if n.startswith("data.mdb.damaged-")]


def test_a_repair_that_cannot_be_written_is_an_error_and_the_damaged_file_stays(tmp_path):
    held = _index(tmp_path / "idx", 20000)
    data = _data(tmp_path / "idx")
    victim = sorted(_live_leaves(data, held))[1]
    with open(data, "r+b") as f:
        f.seek(victim * PSIZE)
        f.write(bytes(PSIZE))
    damaged = open(data, "rb").read()
    with pytest.raises(OSError, match="repair could not be written"):
        with guarded(str(tmp_path / "idx"), map_size=1):  # the salvaged records overflow the 1 MiB map floor
            pytest.fail("the block must not run when the repair failed")
    assert open(data, "rb").read() == damaged
    assert not [n for n in os.listdir(tmp_path / "idx") if n.startswith(("data.mdb.damaged-", "salvage-"))]


def test_an_lmdb_engine_of_another_file_layout_is_refused_before_any_file_is_judged(tmp_path, monkeypatch):
    """The walkers read LMDB 0.9's layout: under another engine every file would look damaged and be replaced at
    every start, so the guard refuses to open instead, naming the fix."""
    import lmdb

    _index(tmp_path / "idx", 10)
    before = sorted(os.listdir(tmp_path / "idx"))
    monkeypatch.setattr(lmdb, "version", lambda: (1, 0, 0))
    with pytest.raises(OSError, match=r"LMDB 1\.0\.0.*pip install"):
        with guarded(str(tmp_path / "idx")):
            pass
    assert sorted(os.listdir(tmp_path / "idx")) == before


def test_the_verdict_and_the_modes_the_config_may_name():
    assert CHECK_MODES == ("fast", "full") and ON_DAMAGE == ("salvage", "reset")
    assert [Verdict(a).repaired for a in ("verified", "in_use", "new", "salvaged", "reset")] == \
        [False, False, False, True, True]
    assert Verdict("new").as_dict() == {"action": "new", "reason": "", "problems": [], "kept": 0, "claimed": 0,
                                        "moved_to": "", "seconds": {}}
