"""``l3 ls``: what an L3 index and its disks hold: deployments, ranks, kinds, pages and bytes, and each rank's slabs.

Read-only: the index is opened read-only (never created) and slabs are only stat'ed, so it is safe next to live
servers. Given a config it looks at the config's index and under every configured disk; given an index directory
alone it finds the slabs through the owner lock files the stores left in it (each names its slab directory, taken
relative to the index where the same tree holds it: a copied tree lists its own slabs, never the original's).

An index key carries a deployment's tag (a hash of its ``deployment_id``), not its name: a name is shown when
something on the node names it (an owner lock file in the index directory, a ``<disk>/<deployment>/rank<r>``
directory, a slab sidecar); else the tag alone (``name unknown``).

The census here (:func:`census`, :func:`deployment_names`, :func:`slab_info`) is what ``fsck`` uses too, to list the
deployments an index holds and to see a truncated slab.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import sys
from dataclasses import asdict, dataclass, field
from typing import NamedTuple

from ..config import L3Config, L3ConfigError
from ..disk.format import HASH_BYTES, PayloadKind
from ..disk.slab_dir import read_slab_meta, slab_namespaces
from ..engine.index import KEY_LEN, VALUE_LEN, IndexEntry, L3Index, deployment_tag, split_key
from . import exit_codes

__all__ = ["SlabInfo", "Census", "census", "deployment_names", "slab_info", "kind_name", "human_bytes", "inventory",
           "render", "ls_main"]

_LOCK_RE = re.compile(r"^owner-(.+)-rank(\d+)\.lock$")
_RANK_RE = re.compile(r"^rank(\d+)$")


def kind_name(kind_byte: int) -> str:
    """A payload kind as operators read it (``target_kv``), or the byte when no version defines it."""
    kind = PayloadKind.from_byte(kind_byte)
    return kind.label if kind is not None else f"unknown kind byte {kind_byte}"


def human_bytes(n: "int | None") -> str:
    if n is None:
        return "? B"
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


@dataclass
class SlabInfo:
    """One slab file as its sidecar describes it and as it is on disk."""

    path: str
    kind: str
    deployment_id: "str | None"
    rank: "int | None"
    disk: "int | None"
    slot_bytes: int
    num_slots: int  # what the sidecar says the owner sized it to
    file_bytes: int
    format_version: "int | None" = None
    namespaces: set = field(default_factory=set, repr=False)

    @property
    def expected_bytes(self) -> int:
        return self.num_slots * self.slot_bytes

    @property
    def file_slots(self) -> int:
        """Whole slots the file holds (a partial last slot is no slot: its header, at the slot's end, is gone)."""
        return min(self.num_slots, self.file_bytes // self.slot_bytes)

    @property
    def truncated(self) -> bool:
        return self.file_bytes < self.expected_bytes

    @property
    def slots_lost(self) -> int:
        return self.num_slots - self.file_slots

    def as_dict(self) -> dict:
        d = asdict(self)
        del d["namespaces"]
        d.update(expected_bytes=self.expected_bytes, truncated=self.truncated, slots_lost=self.slots_lost)
        return d


def slab_info(path: str, meta: "dict | None" = None) -> "SlabInfo | None":
    """The slab at ``path`` with its sidecar, or None when the file or a usable sidecar is missing."""
    meta = read_slab_meta(path) if meta is None else meta
    if not isinstance(meta, dict):
        return None
    sb, n = meta.get("slot_bytes"), meta.get("num_slots")
    if not (isinstance(sb, int) and isinstance(n, int) and sb > 0 and n >= 0):
        return None
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        return None
    kind = meta.get("kind") if isinstance(meta.get("kind"), str) else os.path.basename(path).split(".")[0]
    ints = {k: meta.get(k) if isinstance(meta.get(k), int) and not isinstance(meta.get(k), bool) else None
            for k in ("rank", "disk", "format_version")}
    dep = meta.get("deployment_id") if isinstance(meta.get("deployment_id"), str) else None
    return SlabInfo(os.path.abspath(path), kind, dep, ints["rank"], ints["disk"], sb, n, size,
                    ints["format_version"], slab_namespaces(meta))


class Census(NamedTuple):
    """Every record of an index, counted by (deployment tag, rank, disk, kind byte, namespace digest)."""

    entries: int
    groups: "collections.Counter"
    damaged: int  # keys found out of sorted order (a damaged page)
    malformed: int  # records that are not a key and an entry

    def by_deployment(self) -> "dict[bytes, int]":
        out: dict[bytes, int] = collections.Counter()
        for (tag, *_), n in self.groups.items():
            out[tag] += n
        return dict(out)


def census(idx: L3Index) -> Census:
    """One read transaction over the whole index, walked by cursor (page order: a damaged key hides nothing).
    The walk counts raw (key prefix, value head) pairs and decodes each group once: it costs a few microseconds
    per entry, next to which fsck's blob reads are everything."""
    with idx.env.begin(db=idx.db, buffers=False) as txn:
        return census_records(txn.cursor().iternext(keys=True, values=True))


def census_records(records) -> Census:
    """The census of (key, value) records in key order: an index's cursor walk, or what a salvage of a damaged
    index file would keep (fsck, engine/index_check.py)."""
    raw: collections.Counter = collections.Counter()
    damaged = malformed = 0
    prev = None
    head = 4  # a value starts with rank (u16) and disk (u16) (index.py's layout; the tests check what comes out)
    for k, v in records:
        if prev is not None and k <= prev:
            damaged += 1
        prev = k
        if len(k) != KEY_LEN or len(v) != VALUE_LEN:
            malformed += 1
            continue
        raw[(k[:-HASH_BYTES], v[:head])] += 1
    groups: collections.Counter = collections.Counter()
    for (prefix, rank_disk), n in raw.items():
        key = split_key(prefix + bytes(HASH_BYTES))
        e = IndexEntry.unpack(rank_disk + bytes(VALUE_LEN - head))
        groups[(key.deployment, e.rank, e.disk, key.kind, key.namespace)] += n
    return Census(sum(groups.values()), groups, damaged, malformed)


def _lock_files(index_path: str) -> "list[tuple[str, int, dict | None]]":
    """(deployment, rank, what the owner wrote) for every owner lock file in the index directory."""
    out = []
    try:
        names = sorted(os.listdir(index_path))
    except OSError:
        return out
    for name in names:
        m = _LOCK_RE.match(name)
        if not m:
            continue
        try:
            with open(os.path.join(index_path, name), "rb") as f:
                holder = json.loads(f.read(4096) or b"null")
        except (OSError, ValueError):
            holder = None
        out.append((m.group(1), int(m.group(2)), holder if isinstance(holder, dict) else None))
    return out


def _deployment_dirs(disk_path: str) -> "list[str]":
    """Names of ``<disk>/<name>/rank<r>`` directories: deployments with slabs on this disk."""
    try:
        names = sorted(os.listdir(disk_path))
    except OSError:
        return []
    out = []
    for name in names:
        d = os.path.join(disk_path, name)
        try:
            if os.path.isdir(d) and any(_RANK_RE.match(r) for r in os.listdir(d)):
                out.append(name)
        except OSError:
            continue
    return out


def deployment_names(index_path: str, disk_paths=(), also=()) -> "dict[bytes, str]":
    """Tag -> deployment name for every name something on this node gives: ``also`` (a config's own), the owner
    lock files in the index directory, the deployment directories under ``disk_paths``."""
    names = set(also)
    names.update(dep for dep, _, _ in _lock_files(index_path))
    for p in disk_paths:
        names.update(_deployment_dirs(p))
    return {deployment_tag(n): n for n in sorted(names)}


def _slab_files(d: str) -> "list[str]":
    return sorted(glob.glob(os.path.join(glob.escape(d), "*.slab")))


def _common(a: str, b: str) -> str:
    try:
        return os.path.commonpath([a, b])
    except ValueError:
        return os.sep


def _rebased(index_path: str, recorded: str) -> str:
    """Where the slab directory an owner lock recorded is now. A lock keeps the absolute path its store wrote, so in
    a copy of a whole L3 tree (index and disks under one directory) it names the original's slabs. The directory is
    looked for first at the same place relative to the index: under each ancestor of the index below the one it
    shares with the recorded path, nearest first, the longest tail of the recorded path (at least
    ``<deployment>/rank<r>``) that exists there. The recorded path itself where none does (the index alone was
    copied, or the tree is where it was written)."""
    recorded, index_path = os.path.normpath(recorded), os.path.normpath(os.path.abspath(index_path))
    parts = recorded.split(os.sep)[1:]
    shared = _common(recorded, index_path)
    anc = os.path.dirname(index_path)
    while anc != shared and anc.startswith(shared):
        for i in range(len(parts) - 1):  # longest tail first
            cand = os.path.join(anc, *parts[i:])
            if os.path.isdir(cand):
                return cand
        anc = os.path.dirname(anc)
    return recorded


def _collect_slabs(index_path: str, config: "L3Config | None") -> "dict[tuple[str, int], list[SlabInfo]]":
    """(deployment, rank) -> its slabs: under every configured disk; a (deployment, rank) none of them holds, where
    its owner lock file points (rebased onto the index's tree, :func:`_rebased`)."""
    dirs: set[tuple[str, int, str, int | None]] = set()
    if config is not None:
        for i, disk in enumerate(config.disks):
            for dep in _deployment_dirs(disk.path):
                for r in os.listdir(os.path.join(disk.path, dep)):
                    m = _RANK_RE.match(r)
                    if m:
                        dirs.add((dep, int(m.group(1)), os.path.join(disk.path, dep, r), i))
    held = {(dep, rank) for dep, rank, _, _ in dirs}
    for dep, rank, holder in _lock_files(index_path):
        sdir = holder.get("slab_dir") if holder else None
        if not isinstance(sdir, str) or not os.path.isabs(sdir) or (dep, rank) in held:
            continue
        sdir = _rebased(index_path, sdir)
        if os.path.isdir(sdir):
            dirs.add((dep, rank, sdir, None))
    out: dict[tuple[str, int], list[SlabInfo]] = collections.defaultdict(list)
    for dep, rank, d, disk in sorted(dirs, key=lambda x: (x[0], x[1], x[2])):
        for path in _slab_files(d):
            info = slab_info(path)
            if info is None:
                continue
            if info.disk is None:
                info.disk = disk
            out[(dep, rank)].append(info)
    order = {k.label: int(k) for k in PayloadKind}
    for infos in out.values():
        infos.sort(key=lambda s: (s.disk if s.disk is not None else -1, order.get(s.kind, 99), s.path))
    return out


def _slab_for(slabs: "list[SlabInfo]", disk: int, kind: str, ns: bytes) -> "SlabInfo | None":
    """The slab an entry names (a kind has one slab per slot size; the entry's namespace picks among several)."""
    cands = [s for s in slabs if s.disk == disk and s.kind == kind]
    if len(cands) == 1:
        return cands[0]
    return next((s for s in cands if ns in s.namespaces), None)


def inventory(path: str) -> dict:
    """The listing of ``path`` (a config file, or an index directory) as a JSON-able dict. Raises L3ConfigError
    (a bad config, a path that is neither) and OSError (the index cannot be opened)."""
    config = None
    if os.path.isdir(path):
        index_path, map_size = os.path.abspath(path), 2**20
        if not os.path.exists(os.path.join(index_path, "data.mdb")):
            raise L3ConfigError("a directory without an L3 index (no data.mdb): give the L3 config (l3.toml) or its "
                                "index.path")
    else:
        config = L3Config.from_file(path)
        index_path, map_size = config.index_path, config.index_map_size
    out: dict = {"index": index_path, "config": os.path.abspath(path) if config else None,
                 "this_deployment": config.deployment_id if config else None, "exists": True, "entries": 0,
                 "damaged": 0, "malformed": 0, "deployments": []}
    if not os.path.exists(os.path.join(index_path, "data.mdb")):
        out["exists"] = False  # never created: no server has opened this config yet
        cen = Census(0, collections.Counter(), 0, 0)
    else:
        idx = L3Index.open(index_path, map_size, readonly=True)
        try:
            cen = census(idx)
        finally:
            idx.close()
    slabs = _collect_slabs(index_path, config)
    names = deployment_names(index_path, [d.path for d in config.disks] if config else (),
                             also=[config.deployment_id] if config else ())
    names.update({deployment_tag(dep): dep for dep, _ in slabs})
    out.update(entries=cen.entries, damaged=cen.damaged, malformed=cen.malformed)

    deps: dict[bytes, dict] = {}

    def dep_of(tag: bytes) -> dict:
        if tag not in deps:
            name = names.get(tag)
            deps[tag] = {"name": name, "tag": tag.hex(), "this_config": bool(config and name == config.deployment_id),
                         "pages": 0, "bytes": 0, "ranks": {}}
        return deps[tag]

    def rank_of(d: dict, rank: int) -> dict:
        return d["ranks"].setdefault(rank, {"rank": rank, "kinds": {}, "slabs": []})

    for (tag, rank, disk, kb, ns), n in sorted(cen.groups.items()):
        d = dep_of(tag)
        r = rank_of(d, rank)
        label = kind_name(kb)
        slab = _slab_for(slabs.get((d["name"], rank), []), disk, label, ns) if d["name"] else None
        k = r["kinds"].setdefault(label, {"pages": 0, "bytes": 0})
        k["pages"] += n
        d["pages"] += n
        nbytes = n * slab.slot_bytes if slab else None
        for agg in (k, d):
            agg["bytes"] = None if agg["bytes"] is None or nbytes is None else agg["bytes"] + nbytes
    for (dep, rank), infos in slabs.items():
        r = rank_of(dep_of(deployment_tag(dep)), rank)
        r["slabs"] = [s.as_dict() for s in infos]
    if config is not None:
        dep_of(deployment_tag(config.deployment_id))  # listed even when it has nothing: that is the news
    listed = sorted(deps.values(), key=lambda d: (not d["this_config"], d["name"] is None, d["name"] or d["tag"]))
    for d in listed:
        d["ranks"] = [d["ranks"][r] for r in sorted(d["ranks"])]
    out["deployments"] = listed
    return out


def render(inv: dict) -> str:
    n_dep = sum(1 for d in inv["deployments"] if d["pages"])
    if not inv["exists"]:
        head = f"L3 index {inv['index']}: does not exist yet (no server has opened this config)"
    else:
        head = f"L3 index {inv['index']}: {inv['entries']} entries, {n_dep} deployment(s) with pages"
    lines = [head]
    if inv["damaged"] or inv["malformed"]:
        lines.append(f"  index damaged: {inv['damaged']} key(s) out of order, {inv['malformed']} malformed "
                     f"record(s); run `sglang-glm-ext l3 fsck CONFIG`")
    for d in inv["deployments"]:
        who = repr(d["name"]) if d["name"] else f"tag {d['tag']} (name unknown: no owner lock file, slab directory " \
                                                 f"or sidecar on this node names it)"
        mark = " (this config)" if d["this_config"] else ""
        lines.append(f"deployment {who}{mark}: {d['pages']} pages, {human_bytes(d['bytes'])} on disk"
                     if d["pages"] else f"deployment {who}{mark}: no index entries")
        for r in d["ranks"]:
            kinds = ", ".join(f"{k} {v['pages']} pages {human_bytes(v['bytes'])}" for k, v in r["kinds"].items())
            lines.append(f"  rank {r['rank']}: {kinds or 'no pages'}")
            for s in r["slabs"]:
                size = (f"{s['num_slots']} slots x {human_bytes(s['slot_bytes'])} = "
                        f"{human_bytes(s['expected_bytes'])}")
                if s["truncated"]:
                    size += (f", but the file is {human_bytes(s['file_bytes'])}: TRUNCATED, {s['slots_lost']} slots "
                             f"lost (run `sglang-glm-ext l3 fsck`)")
                disk = s["disk"] if s["disk"] is not None else "?"
                lines.append(f"    slab {s['kind']} (disk {disk}) {s['path']}: {size}")
    return "\n".join(lines)


def build_arg_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = parser or argparse.ArgumentParser(prog="sglang-glm-ext l3 ls", description=__doc__.split("\n")[0])
    p.add_argument("path", metavar="CONFIG|INDEX",
                   help="an L3 config (TOML or JSON), or an index directory (the config's index.path)")
    p.add_argument("--json", action="store_true", help="print the listing as JSON")
    return p


def run_args(args: argparse.Namespace) -> int:
    try:
        inv = inventory(args.path)
    except L3ConfigError as e:
        print(f"l3 ls: {args.path}: {e}", file=sys.stderr)
        return exit_codes.USAGE
    except OSError as e:
        print(f"l3 ls: {e}", file=sys.stderr)
        return exit_codes.OPERATIONAL
    print(json.dumps(inv, indent=2, sort_keys=True) if args.json else render(inv))
    return exit_codes.CLEAN


def ls_main(argv: list[str] | None = None) -> int:
    return run_args(build_arg_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(ls_main())
