"""fsck: live / corrupt / orphan counts, truncated slabs, the deployments an index holds, --repair, exit codes (as
e2fsck's), CLI wiring. Every case runs on real slabs and a real LMDB index."""

import argparse
import json
import os
import struct

import numpy as np

import l3kit
from l3kit import K, NS
from sglang_glm_ext.l3.cli import add_l3_subcommands
from sglang_glm_ext.l3.config import L3Config
from sglang_glm_ext.l3.disk.format import HEADER_SIZE, PayloadKind, slot_bytes_for
from sglang_glm_ext.l3.tools.fsck import fsck, fsck_main
from sglang_glm_ext.l3.engine.index import IndexEntry, make_key
from sglang_glm_ext.l3.engine.store import L3Store

PB = 4096 + 50
SLOT = slot_bytes_for(PB)
H = SLOT - HEADER_SIZE  # format v2: the header is the slot's last 128 bytes


def key(i):
    return l3kit.key(i, "f")


def setup(tmp_path, n=6):
    cfg_path = tmp_path / "l3.toml"
    cfg_path.write_text(f'deployment_id = "fs"\n[[disks]]\npath = "{tmp_path}/disk"\nbudget = {20 * SLOT}\n'
                        f'[index]\npath = "{tmp_path}/index"\nmap_size = "16MiB"\n')
    cfg = L3Config.from_file(cfg_path)
    s = L3Store.open(cfg, rank=0, namespace=NS, page_bytes={K: PB})
    assert all(s.spill(K, [key(i) for i in range(n)], [np.full(PB, i, np.uint8) for i in range(n)]))
    assert s.flush(30)
    slots = {i: s.diagnostics().entry(K, key(i)).slot for i in range(n)}
    return cfg, str(cfg_path), s, slots


def poke(path, offset, data):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def test_clean_store_is_clean(tmp_path):
    cfg, path, s, _ = setup(tmp_path)
    s.close()
    rep = fsck(cfg)
    assert (rep.live, rep.corrupt, rep.orphan_index, rep.orphan_slot) == (6, 0, 0, 0)
    assert rep.empty == 14 and rep.exit_code == 0
    assert fsck_main([path]) == 0


def test_corrupt_orphans_and_repair(tmp_path, capsys):
    cfg, path, s, slots = setup(tmp_path)
    slab = s.slab(K).path
    poke(slab, slots[0] * SLOT + 7, b"\xff\x00")                         # payload bit rot -> corrupt
    poke(slab, slots[1] * SLOT + SLOT - 4096, bytes(4096))                # header wiped -> orphaned entry
    s.index.delete(s.diagnostics().index_key(K, key(2)))  # blob without entry -> orphan slot
    s.index.put(make_key(s.dep, s.ns, K, bytes.fromhex(key(99))), IndexEntry(0, 0, 19, 1))  # -> empty slot
    poke(slab, slots[3] * SLOT + H + 8, struct.pack("<H", 9))             # version 9 -> unknown_version
    s.close()
    rep = fsck(cfg)
    assert rep.live == 2 and rep.corrupt == 1 and rep.orphan_index == 2
    assert rep.orphan_slot == 1 and rep.unknown_version == 1
    assert rep.exit_code == 4
    assert fsck_main([path, "--json"]) == 4
    out = json.loads(capsys.readouterr().out)
    assert out["corrupt"] == 1 and out["exit_code"] == 4
    assert fsck_main([path, "--repair"]) == 1
    capsys.readouterr()
    rep = fsck(cfg)
    assert rep.corrupt == 0 and rep.orphan_index == 0 and rep.exit_code == 0 and rep.live == 2
    # The corrupt slot's blob is still on disk but nothing points at it: counted as an inert orphan slot.
    assert rep.orphan_slot == 2


def test_headers_only_misses_payload_rot_by_design(tmp_path):
    cfg, path, s, slots = setup(tmp_path)
    poke(s.slab(K).path, slots[0] * SLOT + 1, b"\xaa")
    s.close()
    assert fsck(cfg, headers_only=True).corrupt == 0
    assert fsck(cfg).corrupt == 1


def _v1_header(key_hex: str, ns: bytes, payload: bytes) -> bytes:
    """A format-v1 header as earlier builds wrote it at a slot's start (the test builds the old format itself)."""
    import xxhash

    raw = bytearray(HEADER_SIZE)
    struct.pack_into("<8sHBBI32sQQ16s40s", raw, 0, b"GLML3BLB", 1, int(K), 0, 0, bytes.fromhex(key_hex),
                     len(payload), xxhash.xxh3_64_intdigest(payload), ns, bytes(40))
    struct.pack_into("<Q", raw, 120, xxhash.xxh3_64_intdigest(bytes(raw[:120])))
    return bytes(raw)


def test_old_version_blobs_are_reported_not_corruption_and_repair_drops_their_entries(tmp_path):
    """The upgrade policy: a slot holding a v1 blob (header in front of the payload) is counted as old_version,
    referenced or not; it never makes the exit code fail, and --repair drops the entries that name one."""
    cfg, path, s, slots = setup(tmp_path)
    slab = s.slab(K).path
    payload = bytes(PB)
    for i in (0, 1):  # slot 0's entry stays (a v1 blob behind a live entry), slot 1's goes (an unreferenced one)
        poke(slab, slots[i] * SLOT, _v1_header(key(i), s.ns, payload))
        poke(slab, slots[i] * SLOT + SLOT - 4096, bytes(4096))  # a v1 slot has no v2 trailer
    s.index.delete(s.diagnostics().index_key(K, key(1)))
    s.close()
    rep = fsck(cfg)
    assert rep.old_version == 2 and rep.live == 4 and rep.orphan_index == 0 and rep.corrupt == 0
    assert rep.exit_code == 0 and "old_version=2" in rep.render()
    assert fsck(cfg, headers_only=True).old_version == 2
    rep = fsck(cfg, repair=True)
    assert rep.repaired == 1 and rep.exit_code == 0
    rep = fsck(cfg)
    assert rep.old_version == 2 and rep.live == 4  # both slots still hold v1 bytes; no entry names them now
    assert rep.old_version_slabs == 0  # the slab itself is v2 (its sidecar): only those two slots are old


def test_a_slab_a_v1_build_left_is_reported_as_an_old_version_slab_not_corruption(tmp_path):
    """A slab whose sidecar says format v1 (the node has not restarted since the upgrade): fsck names it and what
    happens to it; its v1 blobs are old_version, never corruption, and the exit code stays clean."""
    cfg, path, s, slots = setup(tmp_path)
    slab = s.slab(K).path
    for i in range(6):
        poke(slab, slots[i] * SLOT, _v1_header(key(i), s.ns, bytes(PB)))
        poke(slab, slots[i] * SLOT + SLOT - 4096, bytes(4096))
    s.close()
    meta = json.loads(open(slab + ".meta.json").read())
    open(slab + ".meta.json", "w").write(json.dumps({**meta, "format_version": 1}))
    rep = fsck(cfg)
    assert rep.old_version_slabs == 1 and rep.old_version == 6 and rep.live == 0 and rep.corrupt == 0
    assert rep.exit_code == 0 and "old_version_slabs=1" in rep.render()
    assert any("format v1 slab" in p and "load cold start drops its entries" in p for p in rep.problems)
    assert fsck(cfg).as_dict()["old_version_slabs"] == 1


def test_cli_subcommands(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    add_l3_subcommands(sub)
    args = parser.parse_args(["l3", "example-config", "--dir", str(tmp_path / "ex")])
    assert args.func(args) == 0
    cfg_path = str(tmp_path / "ex" / "l3.toml")
    assert capsys.readouterr().out.startswith(f"wrote {cfg_path};")
    assert os.path.exists(cfg_path) and L3Config.from_file(cfg_path).deployment_id == "example"
    args = parser.parse_args(["l3", "fsck", cfg_path, "--json"])
    assert args.func(args) == 0
    assert json.loads(capsys.readouterr().out)["live"] == 0
    args = parser.parse_args(["l3", "bench", "--size-gb", "0.01", "--repeats", "3"])
    assert args.size_gb == 0.01 and args.repeats == 3 and args.page_bytes == [3274752, 2**20]


def _flip_key(data, victim):
    import re

    raw = data.read_bytes()
    with open(data, "r+b") as f:
        for m in re.finditer(re.escape(victim), raw):
            f.seek(m.start())
            f.write(bytes([raw[m.start()] ^ 0xFF]))


_SERVER = """
import sys
from sglang_glm_ext.l3.engine.index import L3Index
ix = L3Index.open(sys.argv[1], 2**24)
print(ix.verdict.action, flush=True)
sys.stdin.read()  # holds the index open until the test closes stdin
"""


def test_a_damaged_index_page_under_a_live_server_is_reported_and_every_entry_still_checked(tmp_path):
    """Issue 7, item 5: with a server running (its open proved the file; the page rotted since), fsck walks past the
    damaged key, checks every entry after it, and says the index is damaged; --repair cannot replace a file a
    server has mapped (LMDB's lock says one has), so the error stays and nothing is moved."""
    import pathlib
    import subprocess
    import sys

    cfg, path, s, slots = setup(tmp_path, n=12)
    ours = sorted(k for k, _ in s.index.iter_prefix(s.dep))
    s.close()
    repo = str(pathlib.Path(__file__).resolve().parents[3])
    env = dict(os.environ, PYTHONPATH=repo + os.pathsep + os.environ.get("PYTHONPATH", ""))
    server = subprocess.Popen([sys.executable, "-c", _SERVER, cfg.index_path], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert server.stdout.readline().strip() == "verified"
        _flip_key(tmp_path / "index" / "data.mdb", ours[len(ours) // 2])
        rep = fsck(cfg)
        assert rep.index_check["action"] == "in_use"
        assert rep.live == 11  # all but the damaged key, which is no longer this deployment's
        assert rep.damaged_index >= 1 and rep.exit_code == 4
        assert any("out of order" in p for p in rep.problems)
        rep = fsck(cfg, repair=True)
        assert rep.exit_code == 4 and rep.index_check["action"] == "in_use"
        assert not list((tmp_path / "index").glob("data.mdb.damaged-*"))
    finally:
        server.stdin.close()
        server.wait(30)


def test_a_damaged_index_file_is_refused_reported_with_what_a_salvage_keeps_and_repaired_by_repair(tmp_path, capsys):
    """Issue 24, item 2: with the node's servers stopped fsck proves the file before mapping it, as a server's first
    open does. Without --repair it changes nothing: damaged_index with the check's findings and what a salvage would
    keep, whose entries are still checked against the slabs (read with pread); exit 4. --repair moves the file aside
    and keeps what is proven (exit 1); then the store is clean."""
    cfg, path, s, slots = setup(tmp_path, n=12)
    victim = sorted(k for k, _ in s.index.iter_prefix(s.dep))[6]
    s.close()
    data = tmp_path / "index" / "data.mdb"
    _flip_key(data, victim)
    before = data.read_bytes()
    rep = fsck(cfg)
    assert rep.exit_code == 4 and rep.damaged_index >= 1 and data.read_bytes() == before
    assert rep.index_check["action"] == "damaged" and rep.index_check["problems"]
    assert (rep.index_check["salvageable"], rep.index_check["claimed"]) == (11, 12)
    assert rep.live == 11 and rep.orphan_slot == 1  # the dropped entry's blob is intact: its slot is free
    assert any("DAMAGED" in p and "11 of its 12" in p for p in rep.problems)
    assert fsck_main([path]) == 4
    out = capsys.readouterr().out
    assert "stop this node's servers and run with --repair" in out and "Traceback" not in out
    assert not list((tmp_path / "index").glob("data.mdb.damaged-*"))

    rep = fsck(cfg, repair=True)
    assert rep.exit_code == 1 and rep.index_check["action"] == "salvaged" and rep.index_check["kept"] == 11
    (aside,) = (tmp_path / "index").glob("data.mdb.damaged-*")
    assert aside.read_bytes() == before and rep.index_check["moved_to"] == str(aside)
    assert rep.live == 11 and rep.damaged_index == 0
    assert fsck_main([path]) == 0  # the new index is sound; the file aside is mentioned, not an error
    assert "delete them once inspected" in capsys.readouterr().out


# ---- truncated slabs (issue 24): expected vs actual size, slots lost, the entries past the end ----

def _forty(tmp_path, n=30):
    """A 40-slot target_kv slab with ``n`` pages (slots 0..n-1, the pool hands out the lowest first)."""
    cfg_path = tmp_path / "l3.toml"
    cfg_path.write_text(f'deployment_id = "fs"\n[[disks]]\npath = "{tmp_path}/disk"\nbudget = {40 * SLOT}\n'
                        f'[index]\npath = "{tmp_path}/index"\nmap_size = "16MiB"\n[gc]\nstart = 1.0\nstop = 0.99\n')
    cfg = L3Config.from_file(cfg_path)
    s = L3Store.open(cfg, rank=0, namespace=NS, page_bytes={K: PB})
    assert all(s.spill(K, [key(i) for i in range(n)], [np.full(PB, i, np.uint8) for i in range(n)]))
    assert s.flush(30)
    slab = s.slab(K).path
    slots = sorted(s.diagnostics().entry(K, key(i)).slot for i in range(n))
    s.close()
    assert slots == list(range(n)) and os.path.getsize(slab) == 40 * SLOT
    return cfg, str(cfg_path), slab


def test_a_slab_cut_from_40_slots_to_20_is_reported_with_sizes_slots_lost_and_entries_past_the_end(tmp_path, capsys):
    """Before: "clean" or a list of "orphaned (empty)" slots, never the word truncated. Now: the slab's expected and
    actual size, the 20 slots lost, the 10 entries past the end by slot; exit 4; --repair deletes those entries and
    gives the file its size back (exit 1); then it is clean (exit 0)."""
    cfg, path, slab = _forty(tmp_path)
    os.truncate(slab, 20 * SLOT)
    rep = fsck(cfg)
    assert (rep.live, rep.past_end, rep.orphan_index, rep.corrupt) == (20, 10, 0, 0)
    (t,) = rep.truncated_slabs
    assert (t["expected_bytes"], t["file_bytes"], t["slots_lost"]) == (40 * SLOT, 20 * SLOT, 20)
    assert t["entries_past_end"] == list(range(20, 30)) and t["kind"] == "target_kv" and not t["restored"]
    assert rep.exit_code == 4
    line = rep.problems[0]
    assert "TRUNCATED" in line and f"{20 * SLOT} B" in line and f"40 slots x {SLOT} B = {40 * SLOT} B" in line
    assert "20 slots of capacity lost" in line and "10 index entries point past the end (slots 20-29)" in line
    assert fsck_main([path, "--json"]) == 4
    out = json.loads(capsys.readouterr().out)
    assert out["slots_lost"] == 20 and out["past_end"] == 10 and out["truncated_slabs"][0]["path"] == slab

    assert fsck_main([path, "--repair"]) == 1
    assert "the file's size restored" in capsys.readouterr().out
    assert os.path.getsize(slab) == 40 * SLOT
    rep = fsck(cfg)
    assert (rep.live, rep.past_end, rep.truncated_slabs, rep.empty, rep.exit_code) == (20, 0, [], 20, 0)


def test_a_slab_cut_short_with_no_entry_past_the_end_is_not_clean(tmp_path):
    """The "80 MB of a bigger slab: clean, slots lost silently" case: no entry is lost, the capacity is."""
    cfg, path, slab = _forty(tmp_path, n=4)
    os.truncate(slab, 25 * SLOT)
    rep = fsck(cfg)
    assert rep.live == 4 and rep.past_end == 0 and rep.exit_code == 4
    assert rep.truncated_slabs[0]["slots_lost"] == 15 and "no index entry points past the end" in rep.problems[0]
    assert fsck(cfg, repair=True).exit_code == 1 and os.path.getsize(slab) == 40 * SLOT
    assert fsck(cfg).exit_code == 0


def test_a_slab_cut_inside_a_slot_loses_that_slot_too(tmp_path):
    """The "10 MB" case: a cut that is no multiple of the slot size; the slot it cuts has lost its header."""
    cfg, path, slab = _forty(tmp_path, n=12)
    os.truncate(slab, 9 * SLOT + SLOT // 2)
    rep = fsck(cfg)
    t = rep.truncated_slabs[0]
    assert rep.live == 9 and rep.past_end == 3 and t["slots_lost"] == 31 and t["entries_past_end"] == [9, 10, 11]
    assert t["file_bytes"] == 9 * SLOT + SLOT // 2 and rep.exit_code == 4


def test_repair_leaves_a_slab_a_live_server_holds_and_says_so(tmp_path):
    """--repair next to a live owner: the entries past the end go (exact deletes are safe under a live server), the
    file a live server holds is not written: errors left (4), the reason named; once the server is gone, 1."""
    cfg, path, slab = _forty(tmp_path)
    os.truncate(slab, 20 * SLOT)
    s = L3Store.open(cfg, rank=0, namespace=NS, page_bytes={K: PB}, cold_start="load")  # a live owner again
    try:
        os.truncate(slab, 20 * SLOT)  # its open restored the size; cut it again under the live owner
        rep = fsck(cfg, repair=True)
        assert rep.repaired_errors == 10 and rep.exit_code == 4
        assert "size NOT restored: a live server holds it" in rep.problems[0]
        assert os.path.getsize(slab) == 20 * SLOT
    finally:
        s.close()
    rep = fsck(cfg, repair=True)
    assert rep.past_end == 0 and rep.exit_code == 1 and os.path.getsize(slab) == 40 * SLOT


# ---- the deployments an index holds (a deployment_id typo is not "clean") ----

def _store_of(tmp_path, dep, n, kinds=(K,)):
    cfg_path = tmp_path / f"{dep}.toml"
    cfg_path.write_text(f'deployment_id = "{dep}"\n[[disks]]\npath = "{tmp_path}/disk"\nbudget = {60 * SLOT}\n'
                        f'[index]\npath = "{tmp_path}/index"\nmap_size = "16MiB"\n')
    cfg = L3Config.from_file(cfg_path)
    s = L3Store.open(cfg, rank=0, namespace=NS, page_bytes={k: PB for k in kinds})
    for k in kinds:
        assert all(s.spill(k, [key(i) for i in range(n)], [np.full(PB, i, np.uint8) for i in range(n)]))
    assert s.flush(30)
    s.close()
    return cfg, str(cfg_path)


def test_a_deployment_id_typo_lists_the_deployments_the_index_holds_and_is_a_config_error(tmp_path, capsys):
    _store_of(tmp_path, "dep", 12, kinds=(K, PayloadKind.INDEX_K))
    _store_of(tmp_path, "other", 5)
    typo = tmp_path / "typo.toml"
    typo.write_text((tmp_path / "dep.toml").read_text().replace('"dep"', '"dpe"'))
    rep = fsck(L3Config.from_file(typo))
    assert rep.slabs_scanned == 0 and rep.deployment_missing and rep.exit_code == 16
    assert {(d["name"], d["entries"]) for d in rep.deployments} == {("dep", 24), ("other", 5)}
    assert "no entry of deployment 'dpe'" in rep.problems[0] and "'dep' (24 entries)" in rep.problems[0]
    assert "'other' (5 entries)" in rep.problems[0] and "deployment 'dpe' not found" in rep.result
    assert fsck_main([str(typo)]) == 16
    assert "Is deployment_id in" in capsys.readouterr().out
    # The right name is clean and still lists its neighbour.
    rep = fsck(L3Config.from_file(tmp_path / "dep.toml"))
    assert rep.exit_code == 0 and rep.live == 24 and len(rep.deployments) == 2


def test_a_deployment_nothing_on_the_node_names_is_listed_by_its_tag(tmp_path):
    import shutil

    from sglang_glm_ext.l3.engine.index import deployment_tag

    _store_of(tmp_path, "dep", 3)
    _store_of(tmp_path, "gone", 4)
    os.unlink(tmp_path / "index" / "owner-gone-rank0.lock")
    shutil.rmtree(tmp_path / "disk" / "gone")
    rep = fsck(L3Config.from_file(tmp_path / "dep.toml"))
    assert {"name": None, "tag": deployment_tag("gone").hex(), "entries": 4} in rep.deployments
    assert rep.exit_code == 0  # the other deployment's state is not this config's to judge


def test_kinds_are_named_never_numbered(tmp_path):
    """An index_k entry with no index_k slab: the line names the kind, not `kind=3`."""
    cfg, path, s, _ = setup(tmp_path)
    s.index.put(make_key(s.dep, s.ns, PayloadKind.INDEX_K, bytes.fromhex(key(1))), IndexEntry(0, 0, 1, 1))
    s.close()
    rep = fsck(cfg)
    assert rep.orphan_index == 1 and rep.exit_code == 4
    (line,) = [p for p in rep.problems if "index_k" in p]
    assert "missing slab" in line and "kind=" not in line and f"kind={int(PayloadKind.INDEX_K)}" not in line


# ---- exit codes: 0 clean, 1 repaired, 4 left, 8 operational, 16 usage/config ----

def test_exit_codes_tell_config_io_and_damage_apart(tmp_path, capsys):
    from sglang_glm_ext.l3.tools import exit_codes

    assert (exit_codes.CLEAN, exit_codes.REPAIRED, exit_codes.LEFT, exit_codes.OPERATIONAL, exit_codes.USAGE) == \
        (0, 1, 4, 8, 16)
    cfg, path, s, _ = setup(tmp_path)
    s.close()
    bad = tmp_path / "bad.toml"
    bad.write_text("deployment_id = \n")
    assert fsck_main([str(bad)]) == 16  # a config that does not load
    assert fsck_main([str(tmp_path / "missing.toml")]) == 16
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and "Traceback" not in err
    data = tmp_path / "index" / "data.mdb"
    raw = data.read_bytes()
    data.write_bytes(raw[:4096 * 2])  # cut short: the committed meta names pages past the end
    assert fsck_main([path]) == 4
    assert "past the end of the file" in capsys.readouterr().out
    data.write_bytes(b"\0" * len(raw))  # no LMDB file at all: damage too (--repair would start an empty index)
    assert fsck_main([path]) == 4
    assert "no valid meta page" in capsys.readouterr().out
    data.write_bytes(raw)
    lock = tmp_path / "index" / "lock.mdb"
    lock.unlink()
    lock.mkdir()  # the index cannot be opened at all: an operational error, not damage
    assert fsck_main([path]) == 8
    err = capsys.readouterr().err
    assert "cannot check" in err and "lock.mdb" in err and "Traceback" not in err


def test_usage_errors_exit_16(capsys):
    parser = argparse.ArgumentParser()
    add_l3_subcommands(parser.add_subparsers(dest="command", required=True))
    for argv in (["l3", "fsck"], ["l3", "fsck", "x.toml", "--bogus"], ["l3", "ls"]):
        try:
            parser.parse_args(argv)
        except SystemExit as e:
            assert e.code == 16, argv
        else:
            raise AssertionError(argv)
    assert "error:" in capsys.readouterr().err
