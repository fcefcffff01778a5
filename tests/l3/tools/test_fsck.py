"""fsck: live / corrupt / orphan counts, --repair, exit codes, CLI wiring."""

import argparse
import json
import os
import struct

import numpy as np

import l3kit
from l3kit import K, NS
from sglang_glm_ext.l3.cli import add_l3_subcommands
from sglang_glm_ext.l3.config import L3Config
from sglang_glm_ext.l3.disk.format import HEADER_SIZE, slot_bytes_for
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
    slots = {i: s.index.get(s._ikey(K, bytes.fromhex(key(i)))).slot for i in range(n)}
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
    s.index.delete(s._ikey(K, bytes.fromhex(key(2))))                    # blob without entry -> orphan slot
    s.index.put(make_key(s.dep, s.ns, K, bytes.fromhex(key(99))), IndexEntry(0, 0, 19, 1))  # -> empty slot
    poke(slab, slots[3] * SLOT + H + 8, struct.pack("<H", 9))             # version 9 -> unknown_version
    s.close()
    rep = fsck(cfg)
    assert rep.live == 2 and rep.corrupt == 1 and rep.orphan_index == 2
    assert rep.orphan_slot == 1 and rep.unknown_version == 1
    assert rep.exit_code == 2
    assert fsck_main([path, "--json"]) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["corrupt"] == 1 and out["exit_code"] == 2
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
    s.index.delete(s._ikey(K, bytes.fromhex(key(1))))
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
    cfg_path = capsys.readouterr().out.strip()
    assert os.path.exists(cfg_path) and L3Config.from_file(cfg_path).deployment_id == "example"
    args = parser.parse_args(["l3", "fsck", cfg_path, "--json"])
    assert args.func(args) == 0
    assert json.loads(capsys.readouterr().out)["live"] == 0
    args = parser.parse_args(["l3", "bench", "--size-gb", "0.01", "--repeats", "3"])
    assert args.size_gb == 0.01 and args.repeats == 3 and args.page_bytes == [3274752, 2**20]


def test_a_damaged_index_page_is_reported_and_every_entry_still_checked(tmp_path):
    """Issue 7, item 5: fsck walks past a damaged key, checks every entry after it, and says the index is damaged."""
    import re

    cfg, path, s, slots = setup(tmp_path, n=12)
    ours = sorted(k for k, _ in s.index.iter_prefix(s.dep))
    victim = ours[len(ours) // 2]
    s.close()
    data = tmp_path / "index" / "data.mdb"
    raw = data.read_bytes()
    with open(data, "r+b") as f:
        for m in re.finditer(re.escape(victim), raw):
            f.seek(m.start())
            f.write(bytes([raw[m.start()] ^ 0xFF]))
    rep = fsck(cfg)
    assert rep.live == 11  # all but the damaged key, which is no longer this deployment's
    assert rep.damaged_index >= 1 and rep.exit_code == 2
    assert any("out of order" in p for p in rep.problems)
    assert fsck(cfg, repair=True).exit_code == 2  # repair drops entries; it cannot re-sort an LMDB page
