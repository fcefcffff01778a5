"""``l3 fsck``: check that the shared index and the slabs of one deployment agree.

Categories (counted per slab and in total):

* live            index entry -> slot whose header names exactly that page and whose payload checksum matches
* corrupt         index entry -> slot whose header names the page but the payload checksum (or length) fails
* orphan_index    index entry -> slot that does not hold that page (other page, empty, bad header, out of range,
                  slab missing); serving it would be a miss, never bytes, but it wastes the entry
* orphan_slot     slot with a valid header that no index entry points at (inert; overwritten on reuse)
* unknown_version header written by a format version this build does not know (a newer server's blob: a miss
                  here, not corruption, never dropped; see l3_format.md)
* old_version     a blob of an earlier format (v1: header in front of the payload). This build never serves one;
                  a ``load`` cold start drops the entries of an old-format slab, ``--repair`` drops the entries
                  that name one. Not corruption: the exit code ignores it
* old_version_slabs  slabs whose sidecar says an earlier format (the previous owner was a v1 build): a
                  ``load`` cold start keeps none of their entries; not corruption (the exit code ignores it)
* empty           never-written slots
* damaged_index   keys found out of sorted order, or values that are not entries, in the deployment's range (a
                  damaged LMDB page). Every entry is still checked (the scan walks past damage); the page itself
                  cannot be repaired here: stop the node's servers and move the index aside (L3 starts cold)

``--repair`` drops corrupt, orphan_index and old_version entries, conditionally (only if the entry still names the same
location, so a live server's newer write is never removed). Slabs are only read, never written.

Exit code (``fsck_main``): 0 clean; 1 problems found and all repaired; 2 corruption or orphaned entries left,
or a damaged index.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
from dataclasses import asdict, dataclass, field

from ..disk.aligned import AlignedBuffer
from ..config import L3Config, L3ConfigError
from ..disk.format import (FORMAT_VERSION, OLD_FORMAT_VERSIONS, BlobCheck, PayloadKind, check_header, parse_header_reason, slot_header_reason, verify_blob_reason)
from ..engine.index import IndexEntry, L3Index, deployment_tag, split_key
from ..disk.slab_dir import kind_slabs, read_slab_meta, slab_namespaces
from ..disk.slab_reader import SlabReader

__all__ = ["FsckReport", "fsck", "fsck_main"]

_CORRUPT_REASONS = (BlobCheck.PAYLOAD_CHECKSUM, BlobCheck.TRUNCATED, BlobCheck.LENGTH_MISMATCH)


@dataclass
class FsckReport:
    deployment_id: str
    live: int = 0
    corrupt: int = 0
    orphan_index: int = 0
    orphan_slot: int = 0
    unknown_version: int = 0
    old_version: int = 0
    old_version_slabs: int = 0
    empty: int = 0
    damaged_index: int = 0
    slabs_scanned: int = 0
    repaired: int = 0
    repair: bool = False
    problems: list[str] = field(default_factory=list)

    @property
    def needs_repair(self) -> int:
        return self.corrupt + self.orphan_index

    @property
    def exit_code(self) -> int:
        if self.damaged_index:
            return 2
        if self.needs_repair == 0:
            return 0
        return 1 if self.repair and self.repaired >= self.needs_repair else 2

    def as_dict(self) -> dict:
        d = asdict(self)
        d["exit_code"] = self.exit_code
        return d

    def render(self) -> str:
        lines = [f"L3 fsck deployment={self.deployment_id} slabs={self.slabs_scanned}",
                 f"  live={self.live} corrupt={self.corrupt} orphan_index={self.orphan_index} "
                 f"orphan_slot={self.orphan_slot} unknown_version={self.unknown_version} "
                 f"old_version={self.old_version} old_version_slabs={self.old_version_slabs} empty={self.empty} "
                 f"damaged_index={self.damaged_index}"]
        if self.repair:
            lines.append(f"  repaired (index entries dropped): {self.repaired}")
        lines += [f"  - {p}" for p in self.problems]
        verdict = {0: "clean", 1: "repaired", 2: "CORRUPTION FOUND (run with --repair)"}[self.exit_code]
        lines.append(f"  result: {verdict}")
        return "\n".join(lines)


def _note(rep: FsckReport, msg: str, limit: int) -> None:
    if len(rep.problems) < limit:
        rep.problems.append(msg)


def _close(buf: AlignedBuffer) -> None:
    try:
        buf.close()
    except BufferError:  # a payload view is still referenced; the mapping goes with the last reference
        pass


def fsck(config: L3Config, *, repair: bool = False, headers_only: bool = False, max_problems: int = 50) -> FsckReport:
    """Scan every index entry of ``config.deployment_id`` and every slab of its ranks. See the module docstring."""
    rep = FsckReport(config.deployment_id, repair=repair)
    idx = L3Index.open(config.index_path, config.index_map_size)
    try:
        dep = deployment_tag(config.deployment_id)
        groups: dict[tuple[int, int, int], list[tuple[bytes, IndexEntry]]] = collections.defaultdict(list)
        scan = idx.scan(dep)
        if scan.damaged or scan.malformed:
            rep.damaged_index = scan.damaged + scan.malformed
            _note(rep, f"index {config.index_path}: {scan.damaged} key(s) out of order and {scan.malformed} "
                       f"malformed value(s) (a damaged LMDB page); every entry was still checked. Lookups in the "
                       f"damaged page may miss; stop this node's servers and move the index aside to rebuild it "
                       f"cold", max_problems)
        # Which slab an entry names: a kind has one slab per slot size (slab_dir.py); with several, the namespace of
        # the entry's key picks the one whose sidecar lists it (what the owner's cold start does, KindState.slab_of).
        slabs: dict[tuple[int, int, int], list] = {}

        def slab_for(rank, disk, kv, ns) -> "str | None":
            kind = PayloadKind.from_byte(kv)
            if kind is None or not 0 <= disk < len(config.disks):
                return None
            have = slabs.get((rank, disk, kv))
            if have is None:
                have = slabs[(rank, disk, kv)] = [(p, slab_namespaces(read_slab_meta(p)))
                                                  for p in kind_slabs(config, rank, kind, disk)]
            if len(have) == 1:
                return have[0][0]
            return next((p for p, names in have if ns in names), None)

        for key, e in scan.items:
            k = split_key(key)
            groups[(e.rank, e.disk, k.kind, slab_for(e.rank, e.disk, k.kind, k.namespace))].append((key, e))
        referenced: set[tuple[str, int]] = set()
        to_drop: list[tuple[bytes, IndexEntry]] = []
        for (rank, disk, kv, path), items in sorted(groups.items(), key=lambda g: (g[0][:3], g[0][3] or "")):
            kind = PayloadKind.from_byte(kv)
            meta = read_slab_meta(path) if path else None
            if meta is None or not os.path.exists(path):
                for key, e in items:
                    rep.orphan_index += 1
                    to_drop.append((key, e))
                _note(rep, f"{len(items)} entries point at a missing slab (rank={rank} disk={disk} kind={kv}, or a "
                           f"namespace no slab of the kind lists)", max_problems)
                continue
            slot_bytes, num_slots = int(meta["slot_bytes"]), int(meta["num_slots"])
            rd = SlabReader(path, slot_bytes, num_slots=num_slots, tolerant=True)
            buf = AlignedBuffer(slot_bytes)
            try:
                for key, e in sorted(items, key=lambda it: it[1].slot):
                    if not 0 <= e.slot < num_slots:
                        rep.orphan_index += 1
                        to_drop.append((key, e))
                        _note(rep, f"{path}: entry points at slot {e.slot} beyond {num_slots}", max_problems)
                        continue
                    referenced.add((path, e.slot))
                    k = split_key(key)
                    try:
                        if headers_only:
                            hdr, reason = slot_header_reason(*rd.read_headers(e.slot))
                            if hdr is not None:
                                reason = check_header(hdr, kind=kind, content_hash=k.content_hash,
                                                      ns_digest=k.namespace, payload_len=None, slot_bytes=slot_bytes)
                        else:
                            rd.read_slot_into(e.slot, buf, slot_bytes)
                            reason = verify_blob_reason(buf.view, kind=kind, content_hash=k.content_hash,
                                                        ns_digest=k.namespace)[1]
                    except OSError as ex:
                        rep.corrupt += 1
                        to_drop.append((key, e))
                        _note(rep, f"{path} slot {e.slot}: read error {ex}", max_problems)
                        continue
                    if reason is BlobCheck.OK:
                        rep.live += 1
                    elif reason in _CORRUPT_REASONS:
                        rep.corrupt += 1
                        to_drop.append((key, e))
                        _note(rep, f"{path} slot {e.slot}: corrupt ({reason})", max_problems)
                    elif reason is BlobCheck.UNKNOWN_VERSION:
                        rep.unknown_version += 1
                        _note(rep, f"{path} slot {e.slot}: unknown format version", max_problems)
                    elif reason is BlobCheck.OLD_VERSION:
                        rep.old_version += 1
                        to_drop.append((key, e))
                        _note(rep, f"{path} slot {e.slot}: old format version (never served; dropped by a load "
                                   f"cold start or --repair)", max_problems)
                    else:
                        rep.orphan_index += 1
                        to_drop.append((key, e))
                        _note(rep, f"{path} slot {e.slot}: index entry orphaned ({reason})", max_problems)
            finally:
                rd.close()
                _close(buf)

        # Slot pass: every slab of every configured rank on each of its disks, headers only (the trailer; the slot
        # start only where the trailer holds no v2 header, to name a v1 blob).
        for rank in range(config.num_ranks):
            for kind, path in ((k, p) for disk in config.disks_for_rank(rank) for k in PayloadKind
                               for p in kind_slabs(config, rank, k, disk)):
                meta = read_slab_meta(path)
                if meta is None or not os.path.exists(path):
                    continue
                rep.slabs_scanned += 1
                version = meta.get("format_version")
                if isinstance(version, int) and version in OLD_FORMAT_VERSIONS:
                    rep.old_version_slabs += 1
                    _note(rep, f"{path}: format v{version} slab (sidecar); this build serves v{FORMAT_VERSION} and "
                               f"never reads its blobs: a load cold start drops its entries, its slots are reused",
                          max_problems)
                rd = SlabReader(path, int(meta["slot_bytes"]), num_slots=int(meta["num_slots"]), tolerant=True)
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
                _note(rep, "index map full while repairing; enlarge index.map_size", max_problems)
            else:
                still = idx.get_many([k for k, _ in to_drop])
                rep.repaired += sum(1 for now in still if now is None)
    finally:
        idx.close()
    return rep


def build_arg_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = parser or argparse.ArgumentParser(prog="sglang-glm-ext l3 fsck", description=__doc__.split("\n")[0])
    p.add_argument("config", help="L3 config (TOML or JSON)")
    p.add_argument("--repair", action="store_true", help="drop corrupt and orphaned index entries")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--headers-only", action="store_true", help="skip payload checksums (fast; finds no bit rot)")
    return p


def run_args(args: argparse.Namespace) -> int:
    try:
        cfg = L3Config.from_file(args.config)
    except L3ConfigError as e:
        print(f"l3 fsck: {e}", file=sys.stderr)
        return 2
    try:
        rep = fsck(cfg, repair=args.repair, headers_only=args.headers_only)
    except OSError as e:
        print(f"l3 fsck: {e}", file=sys.stderr)
        return 2
    print(json.dumps(rep.as_dict(), indent=2, sort_keys=True) if args.json else rep.render())
    return rep.exit_code


def fsck_main(argv: list[str] | None = None) -> int:
    return run_args(build_arg_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(fsck_main())
