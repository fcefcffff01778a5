"""``l3 fsck``: check that the shared index and the slabs of one deployment agree.

Categories (counted per slab and in total):

* live            index entry -> slot whose header names exactly that page and whose payload checksum matches
* corrupt         index entry -> slot whose header names the page but the payload checksum (or length) fails
* orphan_index    index entry -> slot that does not hold that page (other page, empty, bad header, out of range,
                  slab missing); serving it would be a miss, never bytes, but it wastes the entry
* past_end        index entry -> slot past the end of a truncated slab (the file is shorter than its sidecar says):
                  the page is gone. Each truncated slab is reported with its expected and actual size, the slots
                  lost and the slots its entries name (``truncated_slabs``)
* orphan_slot     slot with a valid header that no index entry points at. Already free: the index is the only record
                  of which slots are taken, so the owner hands such a slot out again (a slot written and not yet
                  committed by a live server looks the same, which is why fsck never touches one)
* unknown_version header written by a format version this build does not know (a newer server's blob: a miss
                  here, not corruption, never dropped; see l3_format.md)
* old_version     a blob of an earlier format (v1: header in front of the payload). This build never serves one;
                  a ``load`` cold start drops the entries of an old-format slab, ``--repair`` drops the entries
                  that name one. Not corruption: the exit code ignores it
* old_version_slabs  slabs whose sidecar says an earlier format (the previous owner was a v1 build): a
                  ``load`` cold start keeps none of their entries; not corruption (the exit code ignores it)
* empty           never-written slots
* damaged_index   the index file itself is damaged (bit rot, a torn or truncated file). With no server of the node
                  running, fsck proves the file as a server's first open does (engine/index_check.py,
                  ``index.check``) before mapping it: a damaged file is reported with the check's findings and what
                  a salvage would keep, and those entries are still checked against the slabs (read with pread,
                  never mapped); nothing is changed. With servers running, the first of them proved the file; a
                  page damaged since shows as keys out of order or values that are not entries in the deployment's
                  range, every entry still checked (the scan walks past damage)

Kinds are named (target_kv, index_k, draft_kv, draft_index_k). The report lists every deployment the index holds
(``deployments``); a config whose deployment has no entries and no slabs while the index holds others is a
config error (a ``deployment_id`` typo), not "clean".

``--repair`` changes exactly this, and is safe next to live servers:

* it deletes the index entries of corrupt, orphan_index, past_end and old_version pages, each only if it is still
  the very entry the scan judged (same location and last access: a live server's newer commit of the page, even
  into the same slot, is never deleted). Their slots are then free: at the owner's next open, or, for a live
  owner, when its GC reaches them (its conditional delete finds the entry gone and frees the slot);
* it restores a truncated slab's size (``ftruncate`` back to what its sidecar says; the regained slots read as
  empty), only under the slab's own lock: a slab a live server holds is left to it (its next open restores the
  size), and the result says so;
* a damaged index file (damaged_index) is repaired as a server's start would (``index.on_damage``): moved aside
  (``data.mdb.damaged-<utc>-<pid>``) and replaced by an index of every entry that can be proven. Only where no
  process of the node has the index open (LMDB's own lock says so): with servers running it is left to them (stop
  them, then run --repair or start one).

Nothing else is written: no blob, no sidecar. Unreferenced blobs (orphan_slot) need nothing: they are free.

Exit status (``fsck_main``, as e2fsck's, see exit_codes.py): 0 clean; 1 errors found and all repaired; 4 errors left
(no --repair, a slab a live server holds, a damaged index file with no --repair or with servers running); 8
operational error (the index or a slab cannot be opened or read); 16 usage or config error (including a deployment_id that names nothing while the index holds
other deployments).
"""

from __future__ import annotations

import argparse
import collections
import fcntl
import json
import os
import sys
from dataclasses import asdict, dataclass, field

import lmdb

from ..disk.aligned import AlignedBuffer
from ..config import L3Config, L3ConfigError
from ..disk.format import (FORMAT_VERSION, OLD_FORMAT_VERSIONS, BlobCheck, PayloadKind, check_header, parse_header_reason, slot_header_reason, verify_blob_reason)
from ..engine.index import IndexDamagedError, IndexEntry, L3Index, ScanResult, deployment_tag, split_key
from ..engine.index_check import Damaged
from ..disk.slab_dir import kind_slabs, read_slab_meta
from ..disk.slab_reader import SlabReader
from . import exit_codes
from .ls import SlabInfo, census, census_records, deployment_names, kind_name, slab_info

__all__ = ["FsckReport", "fsck", "fsck_main"]

_CORRUPT_REASONS = (BlobCheck.PAYLOAD_CHECKSUM, BlobCheck.TRUNCATED, BlobCheck.LENGTH_MISMATCH)


@dataclass
class FsckReport:
    deployment_id: str
    live: int = 0
    corrupt: int = 0
    orphan_index: int = 0
    past_end: int = 0
    orphan_slot: int = 0
    unknown_version: int = 0
    old_version: int = 0
    old_version_slabs: int = 0
    empty: int = 0
    damaged_index: int = 0
    slabs_scanned: int = 0
    repaired: int = 0  # index entries --repair deleted (errors and old_version ones)
    repaired_errors: int = 0  # of them, corrupt / orphan_index / past_end ones
    repair: bool = False
    # One dict per slab shorter than its sidecar says (SlabInfo.as_dict + entries_past_end: the slots its index
    # entries name past the end, and restored: whether --repair gave the file its size back).
    truncated_slabs: list = field(default_factory=list)
    # Every deployment the index holds: {"name" (None: nothing on this node names it), "tag", "entries"}.
    deployments: list = field(default_factory=list)
    deployment_missing: bool = False  # this deployment has no entries and no slabs while the index holds others
    # The index file's check at this open (engine/index_check.py): {"action": "verified" | "new" | "in_use" (a live
    # server opened it first) | "damaged" (left as it is) | "salvaged" | "reset", "problems", "kept" (salvaged) or
    # "salvageable" (damaged), "claimed", "moved_to"}; {} without an index.
    index_check: dict = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def index_repaired(self) -> bool:
        return self.index_check.get("action") in ("salvaged", "reset")

    @property
    def needs_repair(self) -> int:
        """Index entries that are errors (each one a page that cannot be served)."""
        return self.corrupt + self.orphan_index + self.past_end

    @property
    def slots_lost(self) -> int:
        return sum(t["slots_lost"] for t in self.truncated_slabs)

    @property
    def errors_left(self) -> int:
        entries = self.needs_repair - (self.repaired_errors if self.repair else 0)
        short = sum(1 for t in self.truncated_slabs if not t["restored"])
        return max(0, entries) + short + (1 if self.damaged_index else 0)

    @property
    def exit_code(self) -> int:
        if self.deployment_missing:
            return exit_codes.USAGE
        if self.errors_left:
            return exit_codes.LEFT
        if self.needs_repair or self.truncated_slabs or self.index_repaired:
            return exit_codes.REPAIRED  # errors were found and errors_left is 0: --repair mended them all
        return exit_codes.CLEAN

    @property
    def result(self) -> str:
        code = self.exit_code
        if code == exit_codes.USAGE:
            return (f"deployment {self.deployment_id!r} not found: nothing of it on this node (config error: a "
                    f"deployment_id typo?)")
        if code == exit_codes.LEFT:
            if self.repair:
                return "ERRORS LEFT after --repair (see above)"
            if self.index_check.get("action") == "damaged":
                return "ERRORS FOUND (stop this node's servers and run with --repair)"
            return "ERRORS FOUND (run with --repair; safe next to live servers)"
        return {exit_codes.REPAIRED: "errors found and repaired", exit_codes.CLEAN: "clean"}[code]

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(exit_code=self.exit_code, result=self.result, slots_lost=self.slots_lost,
                 errors_left=self.errors_left)
        return d

    def render(self) -> str:
        lines = [f"L3 fsck deployment={self.deployment_id} slabs={self.slabs_scanned}",
                 f"  live={self.live} corrupt={self.corrupt} orphan_index={self.orphan_index} "
                 f"past_end={self.past_end} orphan_slot={self.orphan_slot} (free) "
                 f"unknown_version={self.unknown_version} old_version={self.old_version} "
                 f"old_version_slabs={self.old_version_slabs} empty={self.empty} damaged_index={self.damaged_index}"
                 + (f" truncated_slabs={len(self.truncated_slabs)} (slots lost: {self.slots_lost})"
                    if self.truncated_slabs else "")]
        if self.repair:
            restored = sum(1 for t in self.truncated_slabs if t["restored"])
            lines.append(f"  repaired: {self.repaired} index entries deleted ({self.repaired_errors} errors, "
                         f"{self.repaired - self.repaired_errors} old-format), {restored} slab size(s) restored"
                         + (f", the index file replaced ({self.index_check['action']})" if self.index_repaired else "")
                         + "; no blob or sidecar written")
        lines += [f"  - {p}" for p in self.problems]
        lines.append(f"  result: {self.result}")
        return "\n".join(lines)


def _note(rep: FsckReport, msg: str, limit: int) -> None:
    if len(rep.problems) < limit:
        rep.problems.append(msg)


def _close(buf: AlignedBuffer) -> None:
    try:
        buf.close()
    except BufferError:  # a payload view is still referenced; the mapping goes with the last reference
        pass


def _slot_ranges(slots) -> str:
    """``3, 7-9, 12`` (at most 12 runs, then how many more)."""
    runs: list[list[int]] = []
    for s in sorted(set(slots)):
        if runs and s == runs[-1][1] + 1:
            runs[-1][1] = s
        else:
            runs.append([s, s])
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs[:12])
    return text + (f" and {len(runs) - 12} more runs" if len(runs) > 12 else "")


def _restore_size(info: SlabInfo) -> "str | None":
    """Give a truncated slab its size back under the slab's own lock; None when done, else why not."""
    try:
        fd = os.open(info.path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        return f"cannot open it for writing: {e.strerror or e}"
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return ("a live server holds it (left to it: it writes the slots again as it reuses them, and its next "
                    "open restores the size)")
        if os.fstat(fd).st_size < info.expected_bytes:  # re-checked under the lock
            os.ftruncate(fd, info.expected_bytes)
            os.fsync(fd)
        return None
    except OSError as e:
        return f"cannot extend it: {e.strerror or e}"
    finally:
        os.close(fd)  # drops the lock


class _Slabs:
    """Each slab of the deployment once: where an entry's (rank, disk, kind, namespace) points, and its geometry."""

    def __init__(self, config: L3Config):
        self.config = config
        self.by_path: dict[str, "SlabInfo | None"] = {}
        self._lists: dict[tuple[int, int, int], list[str]] = {}

    def info(self, path: str) -> "SlabInfo | None":
        if path not in self.by_path:
            self.by_path[path] = slab_info(path)
        return self.by_path[path]

    def of_kind(self, rank: int, disk: int, kind: PayloadKind) -> "list[str]":
        key = (rank, disk, int(kind))
        if key not in self._lists:
            self._lists[key] = kind_slabs(self.config, rank, kind, disk)
        return self._lists[key]

    def for_entry(self, rank: int, disk: int, kind_byte: int, ns: bytes) -> "tuple[str | None, str]":
        """(slab path, "") or (None, why no slab holds the entry)."""
        kind = PayloadKind.from_byte(kind_byte)
        if kind is None:
            return None, f"entries of {kind_name(kind_byte)} (a damaged key: no slab can hold it)"
        if not 0 <= disk < len(self.config.disks):
            return None, (f"{kind.label} entries of rank {rank} name disk {disk}; the config lists "
                          f"{len(self.config.disks)} disk(s)")
        paths = self.of_kind(rank, disk, kind)
        if len(paths) == 1:
            return paths[0], ""
        hit = next((p for p in paths if ns in (self.info(p).namespaces if self.info(p) else ())), None)
        if hit is not None:
            return hit, ""
        d = self.config.slab_dir(rank, disk)
        if not paths:
            where = (f"no {kind.label} slab in {d}" if os.path.isdir(d)
                     else f"the slab directory {d} does not exist (disks[{disk}].path moved?)")
            return None, f"{kind.label} entries of rank {rank} disk {disk} point at a missing slab: {where}"
        return None, (f"{kind.label} entries of rank {rank} disk {disk} name a namespace none of its "
                      f"{len(paths)} slabs lists in its sidecar")


def fsck(config: L3Config, *, repair: bool = False, headers_only: bool = False, max_problems: int = 50) -> FsckReport:
    """Scan every index entry of ``config.deployment_id`` and every slab of its ranks. See the module docstring."""
    rep = FsckReport(config.deployment_id, repair=repair)
    slab_lines: list[str] = []  # one line per slab-wide finding, shown before the per-slot lines
    dep = deployment_tag(config.deployment_id)
    idx = None
    damage: "Damaged | None" = None  # the check's findings on a damaged index file left as it is
    if os.path.exists(os.path.join(config.index_path, "data.mdb")):
        try:
            # Proven before it is mapped, as a server's first open does; only --repair may replace it.
            idx = L3Index.open(config.index_path, config.index_map_size, check=config.index_check,
                               on_damage=config.index_on_damage if repair else "refuse")
        except IndexDamagedError as e:
            if e.findings is None:  # cut short under live servers: nothing here can read it safely
                raise
            damage = e.findings
    else:  # never created here: fsck does not create one (a wrong index.path would otherwise look clean)
        slab_lines.append(f"no index at {config.index_path}: nothing was ever committed with this config (no server "
                          f"has opened it, or index.path is wrong)")
    try:
        if damage is not None:
            rep.damaged_index = max(1, len(damage.problems))
            rep.index_check = {"action": "damaged", "problems": damage.problems, "salvageable": len(damage.records),
                               "claimed": damage.claimed, "moved_to": ""}
            slab_lines.append(
                f"index {config.index_path}/data.mdb is DAMAGED: {damage.reason}. Left as it is (not mapped: a "
                f"server's first open, or --repair with this node's servers stopped, moves it aside and keeps the "
                f"{len(damage.records)} of its {damage.claimed} claimed entries that can be proven). Those entries "
                f"were checked below")
            mine = [(k, e) for k, e in ((k, IndexEntry.decode(v)) for k, v in damage.records if k.startswith(dep))
                    if e is not None]
            scan = ScanResult(mine, 0, 0, False)
        else:
            scan = idx.scan(dep) if idx is not None else ScanResult([], 0, 0, False)
        v = idx.verdict if idx is not None else None
        if v is not None:
            rep.index_check = {"action": v.action, "problems": v.problems, "kept": v.kept, "claimed": v.claimed,
                               "moved_to": v.moved_to}
            if v.repaired:
                slab_lines.append(
                    f"index {config.index_path}/data.mdb was DAMAGED ({v.reason}); repaired: moved to {v.moved_to}, "
                    f"the new index keeps {v.kept} of the {v.claimed} entries it claimed (index.on_damage = "
                    f"{config.index_on_damage}; the rest are misses, never wrong bytes)")
        if scan.damaged or scan.malformed:
            rep.damaged_index = scan.damaged + scan.malformed
            slab_lines.append(
                f"index {config.index_path}: {scan.damaged} key(s) out of order and {scan.malformed} malformed "
                f"value(s) (a page damaged while this node's servers ran); every entry was still checked. Lookups in "
                f"the damaged page may miss; stop this node's servers and run fsck --repair (or start one)")
        aside = sorted(n for n in _listdir(config.index_path) if n.startswith("data.mdb.damaged-"))
        if aside:
            slab_lines.append(f"index directory {config.index_path} keeps {len(aside)} damaged index file(s) moved "
                              f"aside by a repair ({', '.join(aside[:3])}{' ...' if len(aside) > 3 else ''}): not "
                              f"used; delete them once inspected")
        slabs = _Slabs(config)
        # Which slab an entry names: a kind has one slab per slot size (slab_dir.py); with several, the namespace of
        # the entry's key picks the one whose sidecar lists it (what the owner's cold start does, KindState.slab_of).
        groups: dict[tuple, list[tuple[bytes, IndexEntry]]] = collections.defaultdict(list)
        for key, e in scan.items:
            k = split_key(key)
            path, why = slabs.for_entry(e.rank, e.disk, k.kind, k.namespace)
            groups[(e.rank, e.disk, k.kind, path, why)].append((key, e))
        referenced: set[tuple[str, int]] = set()
        to_drop: list[tuple[bytes, IndexEntry]] = []
        errors: set[bytes] = set()  # keys of to_drop that are errors (not old_version)
        past_end: dict[str, list[int]] = collections.defaultdict(list)

        def drop(key, e, error=True):
            to_drop.append((key, e))
            if error:
                errors.add(key)

        for (rank, disk, kv, path, why), items in sorted(groups.items(), key=lambda g: (g[0][:3], g[0][3] or "")):
            kind = PayloadKind.from_byte(kv)
            info = slabs.info(path) if path else None
            if info is None:
                for key, e in items:
                    rep.orphan_index += 1
                    drop(key, e)
                what = why or f"{kind_name(kv)} slab {path} has no readable sidecar ({path}.meta.json)"
                _note(rep, f"{len(items)} index entries orphaned: {what}", max_problems)
                continue
            rd = SlabReader(path, info.slot_bytes, num_slots=info.num_slots, tolerant=True)
            buf = AlignedBuffer(info.slot_bytes)
            try:
                for key, e in sorted(items, key=lambda it: it[1].slot):
                    if not 0 <= e.slot < info.num_slots:
                        rep.orphan_index += 1
                        drop(key, e)
                        _note(rep, f"{kind.label} {path}: entry points at slot {e.slot}, beyond the slab's "
                                   f"{info.num_slots} slots", max_problems)
                        continue
                    if e.slot >= info.file_slots:  # the file ends before this slot does: the page is gone
                        rep.past_end += 1
                        drop(key, e)
                        past_end[path].append(e.slot)
                        continue
                    referenced.add((path, e.slot))
                    k = split_key(key)
                    try:
                        if headers_only:
                            hdr, reason = slot_header_reason(*rd.read_headers(e.slot))
                            if hdr is not None:
                                reason = check_header(hdr, kind=kind, content_hash=k.content_hash,
                                                      ns_digest=k.namespace, payload_len=None,
                                                      slot_bytes=info.slot_bytes)
                        else:
                            rd.read_slot_into(e.slot, buf, info.slot_bytes)
                            reason = verify_blob_reason(buf.view, kind=kind, content_hash=k.content_hash,
                                                        ns_digest=k.namespace)[1]
                    except OSError as ex:
                        rep.corrupt += 1
                        drop(key, e)
                        _note(rep, f"{kind.label} {path} slot {e.slot}: read error {ex}", max_problems)
                        continue
                    if reason is BlobCheck.OK:
                        rep.live += 1
                    elif reason in _CORRUPT_REASONS:
                        rep.corrupt += 1
                        drop(key, e)
                        _note(rep, f"{kind.label} {path} slot {e.slot}: corrupt ({reason})", max_problems)
                    elif reason is BlobCheck.UNKNOWN_VERSION:
                        rep.unknown_version += 1
                        _note(rep, f"{kind.label} {path} slot {e.slot}: unknown format version", max_problems)
                    elif reason is BlobCheck.OLD_VERSION:
                        rep.old_version += 1
                        drop(key, e, error=False)
                        _note(rep, f"{kind.label} {path} slot {e.slot}: old format version (never served; dropped "
                                   f"by a load cold start or --repair)", max_problems)
                    else:
                        rep.orphan_index += 1
                        drop(key, e)
                        _note(rep, f"{kind.label} {path} slot {e.slot}: index entry orphaned ({reason})",
                              max_problems)
            finally:
                rd.close()
                _close(buf)

        # Slot pass: every slab of every (rank, disk) the config maps, an entry names or a directory exists for (a
        # rank may have slabs on several disks), headers only (the trailer; the slot start only where the trailer
        # holds no v2 header, to name a v1 blob).
        pairs = {(r, d) for r in range(config.num_ranks) for d in config.disks_for_rank(r)}
        pairs |= {(r, d) for r in range(config.num_ranks) for d in range(len(config.disks))
                  if os.path.isdir(config.slab_dir(r, d))}
        pairs |= {(e.rank, e.disk) for _, e in scan.items if 0 <= e.disk < len(config.disks)}
        truncated: list[SlabInfo] = []
        for rank, disk in sorted(pairs):
            for kind, path in ((k, p) for k in PayloadKind for p in slabs.of_kind(rank, disk, k)):
                info = slabs.info(path)
                if info is None:
                    meta = read_slab_meta(path)
                    if os.path.exists(path):
                        slab_lines.append(f"{kind.label} slab {path}: no readable sidecar "
                                          f"({'missing' if meta is None else 'no slot geometry'}); its slots were "
                                          f"not checked (the owner's next open rewrites it)")
                    continue
                rep.slabs_scanned += 1
                if info.truncated:
                    truncated.append(info)
                if info.format_version in OLD_FORMAT_VERSIONS:
                    rep.old_version_slabs += 1
                    slab_lines.append(
                        f"{path}: format v{info.format_version} slab (sidecar); this build serves v{FORMAT_VERSION} "
                        f"and never reads its blobs: a load cold start drops its entries, its slots are reused")
                rd = SlabReader(path, info.slot_bytes, num_slots=info.num_slots, tolerant=True)
                try:
                    for slot in range(rd.num_slots):  # what the file holds
                        if (path, slot) in referenced:
                            continue
                        try:
                            hdr, reason = parse_header_reason(rd.read_header(slot))
                            if hdr is None and reason in (BlobCheck.EMPTY, BlobCheck.BAD_MAGIC):
                                hdr, reason = slot_header_reason(*rd.read_headers(slot))
                        except OSError:
                            continue
                        if reason is BlobCheck.EMPTY:
                            rep.empty += 1
                        elif reason is BlobCheck.UNKNOWN_VERSION:
                            rep.unknown_version += 1
                        elif reason is BlobCheck.OLD_VERSION:
                            rep.old_version += 1
                        elif hdr is not None:
                            rep.orphan_slot += 1
                        else:
                            rep.empty += 1  # garbage in a never-referenced slot is as inert as zeros
                finally:
                    rd.close()

        if repair and to_drop:
            # Exact: only the entry version this scan judged is dropped, so a live server's newer commit of the
            # same page (even into the same slot) survives. By position in a damaged index, where a key search
            # may not find them. An entry gone since the scan counts as repaired; one rewritten since does not
            # (the next fsck judges its new version).
            if idx.delete_scanned(to_drop, damaged=bool(scan.damaged), exact=True) is None:
                slab_lines.append(f"index refused the repair's deletes ({idx.last_refusal or 'map full'}); enlarge "
                                  f"index.map_size or free space on the index's file system")
            else:
                still = idx.get_many([k for k, _ in to_drop])
                for (key, _), now in zip(to_drop, still):
                    if now is None:
                        rep.repaired += 1
                        rep.repaired_errors += key in errors

        for info in truncated:
            slots = past_end.get(info.path, [])
            rec = {**info.as_dict(), "entries_past_end": sorted(slots), "restored": False}
            why_not = None
            if repair:
                why_not = _restore_size(info)
                rec["restored"] = why_not is None
            line = (f"{info.kind} slab {info.path} (rank {info.rank}, disk {info.disk}) is TRUNCATED: "
                    f"{info.file_bytes} B, its sidecar says {info.num_slots} slots x {info.slot_bytes} B = "
                    f"{info.expected_bytes} B; slots {info.file_slots}-{info.num_slots - 1} are gone "
                    f"({info.slots_lost} slots of capacity lost); ")
            line += (f"{len(slots)} index entries point past the end (slots {_slot_ranges(slots)}): their pages are "
                     f"lost" if slots else "no index entry points past the end")
            if repair:
                line += ("; repaired: those entries deleted, the file's size restored (the slots read as empty)"
                         if why_not is None else f"; size NOT restored: {why_not}")
            else:
                line += "; --repair deletes those entries and restores the size"
            slab_lines.append(line)
            rep.truncated_slabs.append(rec)

        # Every deployment the index holds: a deployment_id typo reads as "nothing here" otherwise.
        cen = census(idx) if idx is not None else (census_records(damage.records) if damage is not None else None)
        names = deployment_names(config.index_path, [d.path for d in config.disks], also=[config.deployment_id])
        rep.deployments = [{"name": names.get(tag), "tag": tag.hex(), "entries": n}
                           for tag, n in sorted((cen.by_deployment() if cen else {}).items(), key=lambda t: -t[1])]
        others = [d for d in rep.deployments if d["tag"] != dep.hex()]
        if not scan.items and others:
            listed = ", ".join(f"{d['name']!r} ({d['entries']} entries)" if d["name"]
                               else f"tag {d['tag']} ({d['entries']} entries, name unknown)" for d in others)
            rep.deployment_missing = rep.slabs_scanned == 0
            slab_lines.insert(0, f"the index holds no entry of deployment {config.deployment_id!r} (this config)"
                                 + ("" if rep.slabs_scanned else " and no disk holds a slab of it")
                                 + f"; it holds: {listed}. Is deployment_id in {config.source} right?")
    finally:
        if idx is not None:
            idx.close()
    rep.problems = slab_lines + rep.problems
    return rep


def _listdir(path: str) -> "list[str]":
    try:
        return os.listdir(path)
    except OSError:
        return []


def build_arg_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = parser or argparse.ArgumentParser(prog="sglang-glm-ext l3 fsck", description=__doc__.split("\n")[0],
                                          epilog=exit_codes.EPILOG)
    p.add_argument("config", help="L3 config (TOML or JSON)")
    p.add_argument("--repair", action="store_true",
                   help="delete the index entries of corrupt, orphaned, past-the-end and old-format pages (only the "
                        "very entries judged) and restore truncated slabs' size where no server holds them; safe "
                        "next to live servers; no blob is written. A damaged index file is moved aside and "
                        "replaced by the entries that can be proven (index.on_damage), only while no server of the "
                        "node has it open")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--headers-only", action="store_true", help="skip payload checksums (fast; finds no bit rot)")
    return p


def run_args(args: argparse.Namespace) -> int:
    try:
        cfg = L3Config.from_file(args.config)
    except L3ConfigError as e:
        print(f"l3 fsck: {e}", file=sys.stderr)
        return exit_codes.USAGE
    try:
        rep = fsck(cfg, repair=args.repair, headers_only=args.headers_only)
    except IndexDamagedError as e:  # cut short while servers have it open: left to them (stop them, then --repair)
        print(f"l3 fsck: {e}", file=sys.stderr)
        return exit_codes.LEFT
    except (OSError, lmdb.Error) as e:
        print(f"l3 fsck: cannot check: {e}", file=sys.stderr)
        return exit_codes.OPERATIONAL
    print(json.dumps(rep.as_dict(), indent=2, sort_keys=True) if args.json else rep.render())
    return rep.exit_code


def fsck_main(argv: list[str] | None = None) -> int:
    return run_args(build_arg_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(fsck_main())
