"""The checks of ``l3 fsck`` (fsck.py), one function each, run in this order over one shared :class:`Scan`: open the
index (:func:`open_index`), read this deployment's entries (:func:`read_entries`), judge each entry by its slot
(:func:`check_entries`), count the slots no entry names (:func:`check_slots`), delete the judged entries
(:func:`repair_entries`, --repair), report truncated slabs (:func:`report_truncated`), list the index's deployments
(:func:`list_deployments`). What each finds, and what --repair writes: fsck.py's docstring."""

from __future__ import annotations

import collections
import fcntl
import os
from dataclasses import dataclass, field

from ..config import L3Config
from ..disk.aligned import AlignedBuffer
from ..disk.format import (FORMAT_VERSION, OLD_FORMAT_VERSIONS, BlobCheck, PayloadKind, check_header,
                           parse_header_reason, slot_header_reason, verify_blob_reason)
from ..disk.slab_dir import kind_slabs, read_slab_meta
from ..disk.slab_reader import SlabReader
from ..engine.index import IndexDamagedError, IndexEntry, L3Index, ScanResult, split_key
from ..engine.index_check import Damaged
from .ls import SlabInfo, census, census_records, deployment_names, kind_name, slab_info
from .fsck_report import FsckReport
from .progress import Progress

__all__ = ["Scan", "open_index", "read_entries", "check_entries", "check_slots", "repair_entries",
           "report_truncated", "list_deployments"]

_CORRUPT_REASONS = (BlobCheck.PAYLOAD_CHECKSUM, BlobCheck.TRUNCATED, BlobCheck.LENGTH_MISMATCH)


@dataclass
class Scan:
    """One fsck run: its inputs, the report it fills, and what one check hands the next."""

    config: L3Config
    rep: FsckReport
    dep: bytes  # this deployment's tag: the prefix of its index keys
    repair: bool = False
    headers_only: bool = False
    max_problems: int = 50
    progress: Progress = field(default_factory=Progress.off)
    slab_lines: list[str] = field(default_factory=list)  # one line per slab-wide finding, before the per-slot lines
    idx: "L3Index | None" = None
    damage: "Damaged | None" = None  # the check's findings on a damaged index file left as it is
    entries: ScanResult = field(default_factory=lambda: ScanResult([], 0, 0, False))
    slabs: "_Slabs | None" = None
    referenced: set = field(default_factory=set)  # (slab path, slot) an entry names
    to_drop: list = field(default_factory=list)  # (key, entry) --repair deletes
    errors: set = field(default_factory=set)  # keys of to_drop that are errors (not old_version)
    past_end: dict = field(default_factory=lambda: collections.defaultdict(list))  # slab path -> slots past its end
    truncated: list = field(default_factory=list)  # SlabInfo of each slab shorter than its sidecar says

    def note(self, msg: str) -> None:
        if len(self.rep.problems) < self.max_problems:
            self.rep.problems.append(msg)

    def drop(self, key: bytes, e: IndexEntry, error: bool = True) -> None:
        self.to_drop.append((key, e))
        if error:
            self.errors.add(key)


def open_index(s: Scan) -> None:
    """The index, proven before it is mapped as a server's first open does; only --repair may replace it. A damaged
    file is kept as the check's findings (``s.damage``); none at all is a line, never an index created here."""
    config = s.config
    if not os.path.exists(os.path.join(config.index_path, "data.mdb")):
        # fsck does not create one: a wrong index.path would otherwise look clean
        s.slab_lines.append(f"no index at {config.index_path}: nothing was ever committed with this config (no "
                            f"server has opened it, or index.path is wrong)")
        return
    try:
        s.idx = L3Index.open(config.index_path, config.index_map_size, check=config.index_check,
                             on_damage=config.index_on_damage if s.repair else "refuse")
    except IndexDamagedError as e:
        if e.findings is None:  # cut short under live servers: nothing here can read it safely
            raise
        s.damage = e.findings


def read_entries(s: Scan) -> None:
    """This deployment's entries (``s.entries``): from the index, or what a salvage of a damaged file would keep;
    the index file's own findings (damaged, repaired, damaged pages, files moved aside) as lines."""
    config, rep, damage = s.config, s.rep, s.damage
    if damage is not None:
        rep.damaged_index = max(1, len(damage.problems))
        rep.index_check = {"action": "damaged", "problems": damage.problems, "salvageable": len(damage.records),
                           "claimed": damage.claimed, "moved_to": ""}
        s.slab_lines.append(
            f"index {config.index_path}/data.mdb is DAMAGED: {damage.reason}. Left as it is (not mapped: a "
            f"server's first open, or --repair with this node's servers stopped, moves it aside and keeps the "
            f"{len(damage.records)} of its {damage.claimed} claimed entries that can be proven). Those entries "
            f"were checked below")
        mine = [(k, e) for k, e in ((k, IndexEntry.decode(v)) for k, v in damage.records if k.startswith(s.dep))
                if e is not None]
        s.entries = ScanResult(mine, 0, 0, False)
    elif s.idx is not None:
        s.entries = s.idx.scan(s.dep)
    v = s.idx.verdict if s.idx is not None else None
    if v is not None:
        rep.index_check = {"action": v.action, "problems": v.problems, "kept": v.kept, "claimed": v.claimed,
                           "moved_to": v.moved_to}
        if v.repaired:
            s.slab_lines.append(
                f"index {config.index_path}/data.mdb was DAMAGED ({v.reason}); repaired: moved to {v.moved_to}, "
                f"the new index keeps {v.kept} of the {v.claimed} entries it claimed (index.on_damage = "
                f"{config.index_on_damage}; the rest are misses, never wrong bytes)")
    scan = s.entries
    if scan.damaged or scan.malformed:
        rep.damaged_index = scan.damaged + scan.malformed
        s.slab_lines.append(
            f"index {config.index_path}: {scan.damaged} key(s) out of order and {scan.malformed} malformed "
            f"value(s) (a page damaged while this node's servers ran); every entry was still checked. Lookups in "
            f"the damaged page may miss; stop this node's servers and run fsck --repair (or start one)")
    aside = sorted(n for n in _listdir(config.index_path) if n.startswith("data.mdb.damaged-"))
    if aside:
        s.slab_lines.append(f"index directory {config.index_path} keeps {len(aside)} damaged index file(s) moved "
                            f"aside by a repair ({', '.join(aside[:3])}{' ...' if len(aside) > 3 else ''}): not "
                            f"used; delete them once inspected")


def check_entries(s: Scan) -> None:
    """Every entry judged by the slot it names: live, corrupt, orphan_index, past_end, unknown or old version.
    Which slab an entry names: a kind has one slab per slot size (slab_dir.py); with several, the namespace of the
    entry's key picks the one whose sidecar lists it (what the owner's cold start does, KindState.slab_of)."""
    s.slabs = slabs = _Slabs(s.config)
    groups: dict[tuple, list[tuple[bytes, IndexEntry]]] = collections.defaultdict(list)
    for key, e in s.entries.items:
        k = split_key(key)
        path, why = slabs.for_entry(e.rank, e.disk, k.kind, k.namespace)
        groups[(e.rank, e.disk, k.kind, path, why)].append((key, e))
    s.progress.phase("checking index entries", len(s.entries.items))
    for (rank, disk, kv, path, why), items in sorted(groups.items(), key=lambda g: (g[0][:3], g[0][3] or "")):
        info = slabs.info(path) if path else None
        if info is None:
            for key, e in items:
                s.rep.orphan_index += 1
                s.drop(key, e)
            what = why or f"{kind_name(kv)} slab {path} has no readable sidecar ({path}.meta.json)"
            s.note(f"{len(items)} index entries orphaned: {what}")
            s.progress.advance(len(items))
            continue
        _check_slab_entries(s, PayloadKind.from_byte(kv), path, info, items)


def _check_slab_entries(s: Scan, kind: PayloadKind, path: str, info: SlabInfo, items) -> None:
    """The entries that name one slab, in slot order."""
    rep = s.rep
    rd = SlabReader(path, info.slot_bytes, num_slots=info.num_slots, tolerant=True)
    buf = AlignedBuffer(info.slot_bytes)
    try:
        for key, e in sorted(items, key=lambda it: it[1].slot):
            s.progress.advance()
            if not 0 <= e.slot < info.num_slots:
                rep.orphan_index += 1
                s.drop(key, e)
                s.note(f"{kind.label} {path}: entry points at slot {e.slot}, beyond the slab's "
                       f"{info.num_slots} slots")
                continue
            if e.slot >= info.file_slots:  # the file ends before this slot does: the page is gone
                rep.past_end += 1
                s.drop(key, e)
                s.past_end[path].append(e.slot)
                continue
            s.referenced.add((path, e.slot))
            try:
                reason = _read_reason(s, rd, buf, kind, info, key, e.slot)
            except OSError as ex:
                rep.corrupt += 1
                s.drop(key, e)
                s.note(f"{kind.label} {path} slot {e.slot}: read error {ex}")
                continue
            _judge(s, kind, path, key, e, reason)
    finally:
        rd.close()
        _close(buf)


def _read_reason(s: Scan, rd: SlabReader, buf: AlignedBuffer, kind: PayloadKind, info: SlabInfo, key: bytes,
                 slot: int) -> BlobCheck:
    """What the slot holds for this key: its header alone (--headers-only), else the whole blob checksummed."""
    k = split_key(key)
    if s.headers_only:
        hdr, reason = slot_header_reason(*rd.read_headers(slot))
        if hdr is not None:
            reason = check_header(hdr, kind=kind, content_hash=k.content_hash, ns_digest=k.namespace,
                                  payload_len=None, slot_bytes=info.slot_bytes)
        return reason
    rd.read_slot_into(slot, buf, info.slot_bytes)
    return verify_blob_reason(buf.view, kind=kind, content_hash=k.content_hash, ns_digest=k.namespace)[1]


def _judge(s: Scan, kind: PayloadKind, path: str, key: bytes, e: IndexEntry, reason: BlobCheck) -> None:
    rep = s.rep
    if reason is BlobCheck.OK:
        rep.live += 1
    elif reason in _CORRUPT_REASONS:
        rep.corrupt += 1
        s.drop(key, e)
        s.note(f"{kind.label} {path} slot {e.slot}: corrupt ({reason})")
    elif reason is BlobCheck.UNKNOWN_VERSION:
        rep.unknown_version += 1
        s.note(f"{kind.label} {path} slot {e.slot}: unknown format version")
    elif reason is BlobCheck.OLD_VERSION:
        rep.old_version += 1
        s.drop(key, e, error=False)
        s.note(f"{kind.label} {path} slot {e.slot}: old format version (never served; dropped by a load cold "
               f"start or --repair)")
    else:
        rep.orphan_index += 1
        s.drop(key, e)
        s.note(f"{kind.label} {path} slot {e.slot}: index entry orphaned ({reason})")


def check_slots(s: Scan) -> None:
    """Slot pass: every slab of every (rank, disk) the config maps, an entry names or a directory exists for (a
    rank may have slabs on several disks), headers only (the trailer; the slot start only where the trailer holds
    no v2 header, to name a v1 blob)."""
    config, rep = s.config, s.rep
    pairs = {(r, d) for r in range(config.num_ranks) for d in config.disks_for_rank(r)}
    pairs |= {(r, d) for r in range(config.num_ranks) for d in range(len(config.disks))
              if os.path.isdir(config.slab_dir(r, d))}
    pairs |= {(e.rank, e.disk) for _, e in s.entries.items if 0 <= e.disk < len(config.disks)}
    slabs = [(kind, path) for rank, disk in sorted(pairs) for kind in PayloadKind
             for path in s.slabs.of_kind(rank, disk, kind)]
    s.progress.phase("scanning slots", sum(i.num_slots for i in map(s.slabs.info, (p for _, p in slabs)) if i))
    for kind, path in slabs:
        info = s.slabs.info(path)
        if info is None:
            meta = read_slab_meta(path)
            if os.path.exists(path):
                s.slab_lines.append(f"{kind.label} slab {path}: no readable sidecar "
                                    f"({'missing' if meta is None else 'no slot geometry'}); its slots were "
                                    f"not checked (the owner's next open rewrites it)")
            continue
        rep.slabs_scanned += 1
        if info.truncated:
            s.truncated.append(info)
        if info.format_version in OLD_FORMAT_VERSIONS:
            rep.old_version_slabs += 1
            s.slab_lines.append(
                f"{path}: format v{info.format_version} slab (sidecar); this build serves v{FORMAT_VERSION} "
                f"and never reads its blobs: a load cold start drops its entries, its slots are reused")
        _count_free_slots(s, path, info)


def _count_free_slots(s: Scan, path: str, info: SlabInfo) -> None:
    """The slots of one slab no entry names: empty, orphan_slot (free), unknown or old version."""
    rep = s.rep
    rd = SlabReader(path, info.slot_bytes, num_slots=info.num_slots, tolerant=True)
    try:
        for slot in range(rd.num_slots):  # what the file holds
            s.progress.advance()
            if (path, slot) in s.referenced:
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


def repair_entries(s: Scan) -> None:
    """--repair's deletes. Exact: only the entry version this scan judged is dropped, so a live server's newer
    commit of the same page (even into the same slot) survives. By position in a damaged index, where a key search
    may not find them. An entry gone since the scan counts as repaired; one rewritten since does not (the next
    fsck judges its new version)."""
    idx = s.idx
    if idx.delete_scanned(s.to_drop, damaged=bool(s.entries.damaged), exact=True) is None:
        s.slab_lines.append(f"index refused the repair's deletes ({idx.last_refusal or 'map full'}); enlarge "
                            f"index.map_size or free space on the index's file system")
        return
    still = idx.get_many([k for k, _ in s.to_drop])
    for (key, _), now in zip(s.to_drop, still):
        if now is None:
            s.rep.repaired += 1
            s.rep.repaired_errors += key in s.errors


def report_truncated(s: Scan) -> None:
    """Each truncated slab: a record and a line; --repair gives it its size back where no server holds it."""
    for info in s.truncated:
        slots = s.past_end.get(info.path, [])
        rec = {**info.as_dict(), "entries_past_end": sorted(slots), "restored": False}
        why_not = None
        if s.repair:
            why_not = _restore_size(info)
            rec["restored"] = why_not is None
        line = (f"{info.kind} slab {info.path} (rank {info.rank}, disk {info.disk}) is TRUNCATED: "
                f"{info.file_bytes} B, its sidecar says {info.num_slots} slots x {info.slot_bytes} B = "
                f"{info.expected_bytes} B; slots {info.file_slots}-{info.num_slots - 1} are gone "
                f"({info.slots_lost} slots of capacity lost); ")
        line += (f"{len(slots)} index entries point past the end (slots {_slot_ranges(slots)}): their pages are "
                 f"lost" if slots else "no index entry points past the end")
        if s.repair:
            line += ("; repaired: those entries deleted, the file's size restored (the slots read as empty)"
                     if why_not is None else f"; size NOT restored: {why_not}")
        else:
            line += "; --repair deletes those entries and restores the size"
        s.slab_lines.append(line)
        s.rep.truncated_slabs.append(rec)


def list_deployments(s: Scan) -> None:
    """Every deployment the index holds: a deployment_id typo reads as "nothing here" otherwise."""
    config, rep, damage = s.config, s.rep, s.damage
    cen = census(s.idx) if s.idx is not None else (census_records(damage.records) if damage is not None else None)
    names = deployment_names(config.index_path, [d.path for d in config.disks], also=[config.deployment_id])
    rep.deployments = [{"name": names.get(tag), "tag": tag.hex(), "entries": n}
                       for tag, n in sorted((cen.by_deployment() if cen else {}).items(), key=lambda t: -t[1])]
    others = [d for d in rep.deployments if d["tag"] != s.dep.hex()]
    if not s.entries.items and others:
        listed = ", ".join(f"{d['name']!r} ({d['entries']} entries)" if d["name"]
                           else f"tag {d['tag']} ({d['entries']} entries, name unknown)" for d in others)
        rep.deployment_missing = rep.slabs_scanned == 0
        s.slab_lines.insert(0, f"the index holds no entry of deployment {config.deployment_id!r} (this config)"
                               + ("" if rep.slabs_scanned else " and no disk holds a slab of it")
                               + f"; it holds: {listed}. Is deployment_id in {config.source} right?")


# ---- helpers ----

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


def _listdir(path: str) -> "list[str]":
    try:
        return os.listdir(path)
    except OSError:
        return []

