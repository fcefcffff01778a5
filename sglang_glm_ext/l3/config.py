"""L3 configuration: disks, rank->disk mapping, index, cold start, GC watermarks, queue caps, PLP policy.

Loaded from TOML (``tomllib`` / ``tomli``) or JSON. Every bad value is an :class:`L3ConfigError` whose message
starts with the key path (``disks[1].budget: ...``), raised at load time so a server never starts on a config it
would later misread. Environment overrides are applied here too, once (``SGLANG_CP_L3_COLD_START`` replaces
``cold_start`` for one launch), so the engine reads only the config.

Disks and ranks (``[ranks] mapping``): each ``[[disks]]`` entry is one drive (its index is its position). A rank
writes one drive or several:

* ``"balanced"`` (default): rank ``r`` on disk ``r % len(disks)`` (several disks serve several ranks, one each);
* a list with one entry per rank, each a disk index (``[0, 1, 0]``) or a list of them (``[[0, 1, 2, 3]]``: one rank
  spreads its pages over four drives; ``[[0, 1], [2, 3]]``: two ranks, two drives each);
* ``"all"``: every rank on every disk.

A rank with several disks keeps one slab per (kind, disk) and places each new page on one of them by its content
hash, in proportion to its share of each disk (engine/kinds.py ``KindDisks``); a slow or failing drive sheds its new
pages to the others and costs only the pages it holds. Its first disk is its *home* (``disk_for_rank``: the owner
lock's record, a one-disk rank's only disk).

Budget split (the documented rule):

Writers (``[writers] mode``): a replicated (MLA/DSA) page under context or attention-TP parallelism is written by one
owner among the node's replicas, ``"spread"`` (default: a content hash picks it, see ``hicache/cp_writers.py``) or
``"one_per_node"`` (the node's first replica writes every page; the others still reserve their budget).

1. A disk's ``budget`` is divided equally among the ranks mapped to it (``ranks_on_disk``), rounded down. A rank
   with several disks gets such a share on each of them (``rank_budget(rank, disk)``), and each share sizes that
   disk's slabs on its own (rule 2 applies per disk).
2. A rank's share (on one disk) is divided among the payload kinds:

   * ``payload_split = "equal_slots"`` (default): every kind the store is opened with gets the same number of
     slots, ``n = rank_bytes // sum(slot_bytes[k])``. A page of target KV comes with a page of draft KV / index_k
     for the same tokens, so equal slot counts mean no kind runs out before the others. The count depends on the
     kinds opened together, so no kind can be added after open (``add_kind``) under this rule.
   * ``[payload_weights]`` (``target_kv = 0.8``, ``index_k = 0.2`` ...): kind ``k`` gets
     ``floor(rank_bytes * w_k / sum(w) / slot_bytes[k])`` slots, the sum over EVERY kind the table declares, opened
     or not. So a kind's slab depends on the config alone: a kind added after open (a sidecar draft pool SGLang
     registers after the storage attach) and a restart that opens every kind at once get the same geometry. A
     declared kind that is never opened keeps its share unused. A kind opened without a weight is an error.

A kind that ends up with zero slots is a loud error at open (the budget is too small for one page).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

try:  # Python 3.11+
    import tomllib as _toml
except ModuleNotFoundError:  # pragma: no cover - 3.10
    import tomli as _toml  # type: ignore[no-redef]

from ..declare import EnvVar

# Declared where it is read: one launch's override reaches every rank's engine through L3Config.load
# (l3/feature.py lists it among the feature's env vars).
CP_L3_COLD_START = EnvVar(
    "SGLANG_CP_L3_COLD_START", "",
    "Overrides the L3 config's cold_start ('clear' or 'load') for this launch.",
)
# A slow disk on demand, for the server tests that must kill a server while its write-back is still going (the
# fault seams of disk/slab.py are not reachable inside a server process).
TEST_WRITE_DELAY_MS = EnvVar(
    "SGLANG_GLM_EXT_L3_TEST_WRITE_DELAY_MS", "0",
    "TEST-ONLY fault injection: every L3 slab write sleeps this many milliseconds (a slow disk, so a test can kill "
    "a server in the middle of its write-back). Logged as a warning when set; never set it to serve.",
)

__all__ = [
    "L3ConfigError",
    "DiskConfig",
    "L3Config",
    "COLD_START_MODES",
    "ACK_MODES",
    "PLP_MODES",
    "parse_size",
    "example_config",
    "write_example_config",
]

COLD_START_MODES = ("clear", "load")
INDEX_CHECK_MODES = ("fast", "full")  # engine/index_check.py CHECK_MODES / ON_DAMAGE (a test checks they agree)
INDEX_ON_DAMAGE = ("salvage", "reset")
# When SGLang's write-back (batch_set) is answered (issue 20, item 7): once the pages are in staging and the host copy
# may be released ("write_behind": durable milliseconds later; a crash in between loses them, l3_design.md), or once
# they are durable ("durable": fdatasync'ed and committed, nothing acknowledged is lost).
ACK_MODES = ("write_behind", "durable")
# Who writes a replicated (MLA/DSA) page under CP / attention TP (hicache/cp_writers.py): one owner per page among
# the node's replicas ("spread", write bandwidth grows with the node's disks) or the node's first replica.
WRITER_MODES = ("spread", "one_per_node")
LAYER_FIRST_READS = ("vectored", "single")  # queues.layer_first_reads (L3Config.layer_first_reads)
# queues.layer_first_gil_pause = "page": L3Config.layer_first_gil_pause_bytes is this, more than any page, so a
# layer-first checksum gives the GIL up only at each page's end (disk/format.py, checksum_views).
GIL_PAUSE_PAGE = 1 << 62
PLP_MODES = ("auto", "assume_safe", "assume_unsafe")
DIRECT_MODES = ("auto", "on", "off")
_KIND_NAMES = ("target_kv", "draft_kv", "index_k", "draft_index_k")
# A deployment id names a directory (<disk>/<deployment_id>/rank<r>) and an owner-lock file: a plain name, never
# a path. No separator, no leading '.' (so neither '.' nor '..' nor a hidden name) and no leading '-' (an option to
# every tool an operator points at it); ASCII only, so one id is one name on every file system.
_DEPLOYMENT_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$")
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {
    None: 1, "b": 1,
    "k": 10**3, "kb": 10**3, "kib": 2**10, "ki": 2**10,
    "m": 10**6, "mb": 10**6, "mib": 2**20, "mi": 2**20,
    "g": 10**9, "gb": 10**9, "gib": 2**30, "gi": 2**30,
    "t": 10**12, "tb": 10**12, "tib": 2**40, "ti": 2**40,
}


class L3ConfigError(ValueError):
    """A config value is wrong. The message starts with the key path."""


def parse_size(value: Any, key: str) -> int:
    """Bytes from an int or a string like ``"64 MiB"`` / ``"2GB"`` (SI for KB/MB/GB, binary for KiB/MiB/GiB)."""
    if isinstance(value, bool):
        raise L3ConfigError(f"{key}: expected a byte size, got a boolean")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str):
        m = _SIZE_RE.match(value)
        if not m:
            raise L3ConfigError(f"{key}: cannot parse byte size {value!r} (use e.g. 1073741824, '64MiB', '2GB')")
        unit = m.group(2).lower() if m.group(2) else None
        n = int(float(m.group(1)) * _UNITS[unit])
    else:
        raise L3ConfigError(f"{key}: expected a byte size (int or string), got {type(value).__name__}")
    if n <= 0:
        raise L3ConfigError(f"{key}: must be > 0, got {value!r}")
    return n


def parse_gil_pause(value: Any) -> int:
    """queues.layer_first_gil_pause: "page" (GIL_PAUSE_PAGE), "off" / 0 (0), or a byte size of at least 64 KiB (a
    pause after every that many bytes hashed, and at each page's end)."""
    key = "queues.layer_first_gil_pause"
    if value == "page":
        return GIL_PAUSE_PAGE
    if value == "off" or value == "0" or (value == 0 and not isinstance(value, bool)):
        return 0
    if isinstance(value, str) and not any(c.isdigit() for c in value):
        raise L3ConfigError(f"{key}: unknown value {value!r} (expected \"page\", \"off\", 0 or a size such as "
                            f"\"1MiB\")")
    n = parse_size(value, key)
    if not 64 * 2**10 <= n <= 2**30:
        raise L3ConfigError(f"{key}: a size must be in [64 KiB, 1 GiB] (a smaller one pauses every few chunks, each "
                            f"pause a GIL hand-off), got {n} B; \"page\" pauses once a page")
    return n


def _get(d: Mapping[str, Any], name: str, key: str, types, default=None, required=False):
    if name not in d:
        if required:
            raise L3ConfigError(f"{key}: required key missing")
        return default
    v = d[name]
    if isinstance(v, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise L3ConfigError(f"{key}: expected {types}, got a boolean")
    if not isinstance(v, types):
        tn = "/".join(t.__name__ for t in (types if isinstance(types, tuple) else (types,)))
        raise L3ConfigError(f"{key}: expected {tn}, got {type(v).__name__} {v!r}")
    return v


def _fraction(v: Any, key: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise L3ConfigError(f"{key}: expected a number in (0, 1], got {v!r}")
    v = float(v)
    if not (0.0 < v <= 1.0):
        raise L3ConfigError(f"{key}: must be in (0, 1], got {v}")
    return v


def _pos_int(v: Any, key: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise L3ConfigError(f"{key}: expected a positive integer, got {v!r}")
    return v


@dataclass(frozen=True)
class DiskConfig:
    path: str
    budget: int  # bytes this disk gives to L3, split across the ranks mapped to it


def _test_write_delay_ms() -> int:
    raw = TEST_WRITE_DELAY_MS.raw() or "0"
    try:
        ms = int(raw)
    except ValueError:
        ms = -1
    if not 0 <= ms <= 60_000:
        raise L3ConfigError(f"{TEST_WRITE_DELAY_MS.name}={raw!r}: expected milliseconds from 0 to 60000 (test-only)")
    return ms


def _have_lmdb_verify() -> bool:
    import importlib.util
    try:
        return importlib.util.find_spec("lmdb.verify") is not None
    except (ImportError, ValueError):
        return False


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise L3ConfigError(f"<file>: cannot read L3 config {path!r}: {e}") from e


_LOADED: dict[tuple, "L3Config"] = {}  # (path, file bytes, env overrides) -> the parsed config (load_once)


@dataclass(frozen=True)
class L3Config:
    """Validated L3 configuration. Build with :meth:`load`, :meth:`from_dict` or :meth:`from_file`."""

    disks: tuple[DiskConfig, ...]
    index_path: str
    index_map_size: int
    num_ranks: int = 1
    # The node's first open of the index proves the file before LMDB maps it (engine/index_check.py): "fast" (a
    # schema-exact walk, ~1.2x a load's open) | "full" (also py-lmdb's lmdb.verify, ~1.8x); a damaged file is moved
    # aside and replaced by "salvage" (every entry the walk can prove) | "reset" (an empty index).
    index_check: str = "fast"
    index_on_damage: str = "salvage"
    rank_to_disk: tuple[int, ...] = (0,)  # each rank's home disk: the first of rank_to_disks[r]
    rank_to_disks: tuple[tuple[int, ...], ...] = ()  # each rank's disks (home first); () = one each, rank_to_disk
    deployment_id: str = "default"
    cold_start: str = "clear"
    ack: str = "write_behind"  # ACK_MODES: when the HiCache backend answers SGLang's batch_set
    require_plp: bool = False
    plp: str = "auto"
    direct_io: str = "auto"
    gc_start: float = 0.90
    gc_stop: float = 0.85
    gc_budget_per_round: int = 64
    staging_bytes: int = 256 * 2**20
    max_inflight: int = 256
    # How long one write-back call of SGLang's backup thread may wait: for staging room when it is full (brief
    # backpressure instead of a dropped page, issue 20 item 8; 0 = drop at once) and, with ack = "durable", for its
    # pages to become durable. SGLang's backup thread runs off the scheduler: a wait there costs no decode step.
    wait_ms: int = 5000
    write_batch_pages: int = 32
    io_threads: int = 4
    reload_threads: int = 4
    # How a layer-first page (one chunk per layer) comes off the disk: "vectored" (one O_DIRECT read straight into
    # every chunk: the least CPU) | "single" (one transfer of the whole slot into a bounce buffer, then one copy into
    # the chunks: the fork's way, a contiguous transfer, at the copy's CPU). `sglang-glm-ext l3 bench` measures both
    # on the disk; vectored was as fast or faster on every disk measured so far (docs_internal/l3_design.md, 28).
    layer_first_reads: str = "vectored"
    # Pages of one reload call in adjacent slots of one slab are read in one transfer of up to this many bytes (each
    # page's own spans and its own pad and header, nothing else: engine/reload.py, "Reads of adjacent slots"); 0 =
    # one read per page. Fewer, larger reads cost less CPU per GB (the kernel's per-read work and the interpreter's).
    read_coalesce_bytes: int = 8 * 2**20
    # A layer-first page's checksum holds the GIL (xxhash keeps it for the 16-41 KiB layer chunks), so SGLang's
    # scheduler thread, in the same process, waits while reload threads hash. The checksum may give the GIL up at
    # each page's end (GIL_PAUSE_PAGE, "page"), also after every this many bytes (a size), or never (0, "off": the
    # default). Each pause is a GIL hand-off, 10-45 us of CPU: "page" took the scheduler's p99 wait 2-3x down and the
    # layer-first reload CPU 1.1-1.4x up, over the 1.2x-of-raw-read-+-xxh3 target (l3_design.md, issue 28, run 13).
    layer_first_gil_pause_bytes: int = 0
    payload_weights: Mapping[str, float] | None = None  # None = equal_slots
    writer_mode: str = "spread"  # replicated (MLA/DSA) pages under CP/TP: "spread" over the node's replicas | "one_per_node"
    source: str = field(default="<dict>", compare=False)
    test_write_delay_ms: int = field(default=0, compare=False)  # SGLANG_GLM_EXT_L3_TEST_WRITE_DELAY_MS (tests only)

    def __post_init__(self):
        if not self.rank_to_disks:
            object.__setattr__(self, "rank_to_disks", tuple((d,) for d in self.rank_to_disk))

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "L3Config":
        path = os.fspath(path)
        return cls._parse(_read(path), path)

    @classmethod
    def _parse(cls, raw: bytes, path: str) -> "L3Config":
        if path.endswith(".json"):
            try:
                data = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                raise L3ConfigError(f"<file>: {path!r} is not valid JSON: {e}") from e
        else:
            try:
                data = _toml.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, _toml.TOMLDecodeError) as e:
                raise L3ConfigError(f"<file>: {path!r} is not valid TOML: {e}") from e
        base = os.path.dirname(os.path.abspath(path))
        return cls.from_dict(data, source=path, base_dir=base)

    load = from_file

    @classmethod
    def load_once(cls, path: str | os.PathLike) -> "L3Config":
        """The config at ``path``, parsed once per process: every later call for the same file bytes (and the same
        ``SGLANG_CP_L3_COLD_START``) returns the same object. The launch checks, the flag translation and the
        backend of one process (and doctor) share it; an edited file is parsed again. Errors are not kept."""
        path = os.fspath(path)
        raw = _read(path)
        key = (os.path.abspath(path), raw, CP_L3_COLD_START.raw(), TEST_WRITE_DELAY_MS.raw())
        cfg = _LOADED.get(key)
        if cfg is None:
            cfg = _LOADED[key] = cls._parse(raw, path)
        return cfg

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "<dict>", base_dir: str | None = None) -> "L3Config":
        if not isinstance(data, Mapping):
            raise L3ConfigError("<root>: expected a table/object")
        known = {"deployment_id", "cold_start", "ack", "require_plp", "plp", "direct_io", "disks", "ranks", "index",
                 "gc", "queues", "payload_split", "payload_weights", "writers"}
        for k in data:
            if k not in known:
                raise L3ConfigError(f"{k}: unknown key (known: {', '.join(sorted(known))})")

        def _path(p: str, key: str) -> str:
            if not p:
                raise L3ConfigError(f"{key}: empty path")
            p = os.path.expanduser(p)
            if not os.path.isabs(p):
                if base_dir is None:
                    raise L3ConfigError(f"{key}: relative path {p!r} needs an absolute path in a dict config")
                p = os.path.join(base_dir, p)
            return os.path.normpath(p)

        dep = _get(data, "deployment_id", "deployment_id", str, "default")
        if not _DEPLOYMENT_RE.fullmatch(dep):
            raise L3ConfigError(
                f"deployment_id: {dep!r} must be a plain name: 1-64 characters of A-Z a-z 0-9 . _ -, starting with "
                f"a letter, a digit or '_' (it names a directory, so '.', '..' and path separators are refused)")
        cold = _get(data, "cold_start", "cold_start", str, "clear")
        if cold not in COLD_START_MODES:
            raise L3ConfigError(f"cold_start: unknown mode {cold!r} (expected one of {COLD_START_MODES})")
        override = CP_L3_COLD_START.raw()
        if override:  # one launch's choice wins over the file; a caller's explicit open(cold_start=) over both
            if override not in COLD_START_MODES:
                raise L3ConfigError(f"cold_start: unknown mode {override!r} from {CP_L3_COLD_START.name} "
                                    f"(expected one of {COLD_START_MODES})")
            cold = override
        ack = _get(data, "ack", "ack", str, "write_behind")
        if ack not in ACK_MODES:
            raise L3ConfigError(f"ack: unknown mode {ack!r} (expected one of {ACK_MODES})")
        require_plp = _get(data, "require_plp", "require_plp", bool, False)
        plp = _get(data, "plp", "plp", str, "auto")
        if plp not in PLP_MODES:
            raise L3ConfigError(f"plp: unknown value {plp!r} (expected one of {PLP_MODES})")
        direct = _get(data, "direct_io", "direct_io", str, "auto")
        if direct not in DIRECT_MODES:
            raise L3ConfigError(f"direct_io: unknown value {direct!r} (expected one of {DIRECT_MODES})")

        disks_raw = _get(data, "disks", "disks", list, required=True)
        if not disks_raw:
            raise L3ConfigError("disks: at least one disk is required")
        disks = []
        seen = set()
        for i, d in enumerate(disks_raw):
            key = f"disks[{i}]"
            if not isinstance(d, Mapping):
                raise L3ConfigError(f"{key}: expected a table with path and budget")
            for k in d:
                if k not in ("path", "budget"):
                    raise L3ConfigError(f"{key}.{k}: unknown key (known: path, budget)")
            p = _path(_get(d, "path", f"{key}.path", str, required=True), f"{key}.path")
            if p in seen:
                raise L3ConfigError(f"{key}.path: {p!r} listed twice")
            seen.add(p)
            if "budget" not in d:
                raise L3ConfigError(f"{key}.budget: required key missing")
            disks.append(DiskConfig(p, parse_size(d["budget"], f"{key}.budget")))
        n_disks = len(disks)

        ranks = _get(data, "ranks", "ranks", Mapping, {})
        for k in ranks:
            if k not in ("count", "mapping"):
                raise L3ConfigError(f"ranks.{k}: unknown key (known: count, mapping)")
        mapping = ranks.get("mapping", "balanced")
        count = ranks.get("count")
        if count is not None:
            count = _pos_int(count, "ranks.count")
        if isinstance(mapping, str):
            if mapping not in ("balanced", "all"):
                raise L3ConfigError(f"ranks.mapping: unknown mapping {mapping!r} (use 'balanced', 'all' or a list with "
                                    f"one entry per rank: a disk index or a list of disk indices)")
            count = count or 1
            if mapping == "all":
                r2ds = tuple(tuple(range(n_disks)) for _ in range(count))
            else:
                r2ds = tuple((r % n_disks,) for r in range(count))
        elif isinstance(mapping, list):
            if count is not None and len(mapping) != count:
                raise L3ConfigError(f"ranks.mapping: has {len(mapping)} entries but ranks.count = {count}")
            if not mapping:
                raise L3ConfigError("ranks.mapping: empty list")
            r2ds = tuple(_rank_disks(v, f"ranks.mapping[{i}]", n_disks) for i, v in enumerate(mapping))
            count = len(mapping)
        else:
            raise L3ConfigError(f"ranks.mapping: expected 'balanced', 'all' or a list, got {type(mapping).__name__}")
        r2d = tuple(ds[0] for ds in r2ds)

        index = _get(data, "index", "index", Mapping, required=True)
        for k in index:
            if k not in ("path", "map_size", "check", "on_damage"):
                raise L3ConfigError(f"index.{k}: unknown key (known: path, map_size, check, on_damage)")
        index_path = _path(_get(index, "path", "index.path", str, required=True), "index.path")
        map_size = parse_size(index.get("map_size", 2**30), "index.map_size")
        if map_size < 2**20:
            raise L3ConfigError(f"index.map_size: {map_size} bytes is too small (>= 1 MiB)")
        index_check = _get(index, "check", "index.check", str, "fast")
        if index_check not in INDEX_CHECK_MODES:
            raise L3ConfigError(f"index.check: unknown mode {index_check!r} (expected one of {INDEX_CHECK_MODES})")
        if index_check == "full" and not _have_lmdb_verify():
            raise L3ConfigError("index.check: 'full' runs py-lmdb's lmdb.verify, which this py-lmdb lacks: install "
                                "lmdb>=3.0 (pip install -U lmdb), or use check = 'fast'")
        on_damage = _get(index, "on_damage", "index.on_damage", str, "salvage")
        if on_damage not in INDEX_ON_DAMAGE:
            raise L3ConfigError(f"index.on_damage: unknown action {on_damage!r} (expected one of {INDEX_ON_DAMAGE})")

        gc = _get(data, "gc", "gc", Mapping, {})
        for k in gc:
            if k not in ("start", "stop", "budget_per_round"):
                raise L3ConfigError(f"gc.{k}: unknown key (known: start, stop, budget_per_round)")
        gc_start = _fraction(gc.get("start", 0.90), "gc.start")
        gc_stop = _fraction(gc.get("stop", 0.85), "gc.stop")
        if not gc_start > gc_stop:
            raise L3ConfigError(f"gc.start: must be greater than gc.stop ({gc_start} <= {gc_stop})")
        gc_budget = _pos_int(gc.get("budget_per_round", 64), "gc.budget_per_round")

        q = _get(data, "queues", "queues", Mapping, {})
        qknown = ("staging_bytes", "max_inflight", "wait_ms", "write_batch_pages", "io_threads", "reload_threads",
                  "layer_first_reads", "read_coalesce_bytes", "layer_first_gil_pause")
        for k in q:
            if k not in qknown:
                raise L3ConfigError(f"queues.{k}: unknown key (known: {', '.join(qknown)})")
        staging = parse_size(q.get("staging_bytes", 256 * 2**20), "queues.staging_bytes")
        max_inflight = _pos_int(q.get("max_inflight", 256), "queues.max_inflight")
        wait_ms = q.get("wait_ms", 5000)
        if isinstance(wait_ms, bool) or not isinstance(wait_ms, int) or not 0 <= wait_ms <= 600_000:
            raise L3ConfigError(f"queues.wait_ms: expected an integer in [0, 600000] (milliseconds), got {wait_ms!r}")
        if ack == "durable" and wait_ms == 0:
            raise L3ConfigError("queues.wait_ms: ack = 'durable' answers SGLang once its pages are durable, so it needs "
                                "a wait (e.g. 5000); 0 would answer every write as failed")
        batch = _pos_int(q.get("write_batch_pages", 32), "queues.write_batch_pages")
        io_threads = _pos_int(q.get("io_threads", 4), "queues.io_threads")
        reload_threads = _pos_int(q.get("reload_threads", 4), "queues.reload_threads")
        lf_reads = _get(q, "layer_first_reads", "queues.layer_first_reads", str, "vectored")
        if lf_reads not in LAYER_FIRST_READS:
            raise L3ConfigError(f"queues.layer_first_reads: unknown mode {lf_reads!r} (expected one of "
                                f"{LAYER_FIRST_READS})")
        coalesce = q.get("read_coalesce_bytes", 8 * 2**20)
        off = coalesce == "0" or (coalesce == 0 and not isinstance(coalesce, bool))  # 0: a read a page
        coalesce = 0 if off else parse_size(coalesce, "queues.read_coalesce_bytes")
        if coalesce > 2**30:
            raise L3ConfigError(f"queues.read_coalesce_bytes: at most 1 GiB, got {coalesce} B")
        gil_pause = parse_gil_pause(q.get("layer_first_gil_pause", "off"))

        writers = _get(data, "writers", "writers", Mapping, {})
        for k in writers:
            if k != "mode":
                raise L3ConfigError(f"writers.{k}: unknown key (known: mode)")
        writer_mode = _get(writers, "mode", "writers.mode", str, "spread")
        if writer_mode not in WRITER_MODES:
            raise L3ConfigError(f"writers.mode: unknown mode {writer_mode!r} (expected one of {WRITER_MODES})")

        split = _get(data, "payload_split", "payload_split", str, "equal_slots")
        weights_raw = data.get("payload_weights")
        if split == "equal_slots":
            if weights_raw is not None:
                raise L3ConfigError("payload_weights: set payload_split = 'weights' to use weights")
            weights = None
        elif split == "weights":
            if not isinstance(weights_raw, Mapping) or not weights_raw:
                raise L3ConfigError("payload_weights: payload_split = 'weights' needs a non-empty table")
            weights = {}
            for k, v in weights_raw.items():
                if k not in _KIND_NAMES:
                    raise L3ConfigError(f"payload_weights.{k}: unknown payload kind (known: {', '.join(_KIND_NAMES)})")
                if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
                    raise L3ConfigError(f"payload_weights.{k}: expected a positive number, got {v!r}")
                weights[k] = float(v)
        else:
            raise L3ConfigError(f"payload_split: unknown rule {split!r} (expected 'equal_slots' or 'weights')")

        return cls(
            disks=tuple(disks), index_path=index_path, index_map_size=map_size, index_check=index_check,
            index_on_damage=on_damage, num_ranks=count,
            rank_to_disk=r2d, rank_to_disks=r2ds, deployment_id=dep, cold_start=cold, ack=ack,
            require_plp=require_plp, plp=plp,
            direct_io=direct, gc_start=gc_start, gc_stop=gc_stop, gc_budget_per_round=gc_budget,
            staging_bytes=staging, max_inflight=max_inflight, wait_ms=wait_ms, write_batch_pages=batch,
            io_threads=io_threads,
            reload_threads=reload_threads, layer_first_reads=lf_reads, read_coalesce_bytes=coalesce,
            layer_first_gil_pause_bytes=gil_pause,
            payload_weights=weights,
            writer_mode=writer_mode, source=source,
            test_write_delay_ms=_test_write_delay_ms(),
        )

    # ------------------------------------------------------------------ derived values
    def check_rank(self, rank: int) -> None:
        if isinstance(rank, bool) or not isinstance(rank, int) or not (0 <= rank < self.num_ranks):
            raise L3ConfigError(f"ranks: rank {rank!r} out of range [0, {self.num_ranks}) (ranks.count / ranks.mapping)")

    def disk_for_rank(self, rank: int) -> int:
        """The rank's home disk: its only disk, or the first of several (the owner lock's record, messages)."""
        self.check_rank(rank)
        return self.rank_to_disk[rank]

    def disks_for_rank(self, rank: int) -> tuple[int, ...]:
        """Every disk this rank writes, home first (one for a plain ``mapping`` entry)."""
        self.check_rank(rank)
        return self.rank_to_disks[rank]

    def ranks_on_disk(self, disk: int) -> list[int]:
        return [r for r, ds in enumerate(self.rank_to_disks) if disk in ds]

    def rank_budget(self, rank: int, disk: "int | None" = None) -> int:
        """Bytes of ``disk`` this rank may use: the disk's budget split equally among the ranks mapped to it (0 for a
        disk the rank is not mapped to). Without ``disk``: its shares of all its disks added up."""
        if disk is None:
            return sum(self.rank_budget(rank, d) for d in self.disks_for_rank(rank))
        if disk not in self.disks_for_rank(rank):
            return 0
        return self.disks[disk].budget // len(self.ranks_on_disk(disk))

    @property
    def addable_kinds(self) -> tuple[str, ...]:
        """Kinds whose slab the config sizes on its own (a weight each): the kinds a store may add after open."""
        return tuple(self.payload_weights) if self.payload_weights is not None else ()

    def slots_for_kind(self, rank: int, kind: str, slot_bytes: int, disk: "int | None" = None) -> int:
        """Slots of one kind for this rank on ``disk`` (its home disk by default), from the config alone
        (``payload_weights``); what ``add_kind`` uses."""
        if self.payload_weights is None:
            raise L3ConfigError(
                f"payload_split = 'equal_slots' sizes each payload kind from the kinds a store opens together, so "
                f"{kind} cannot be added after open: use payload_split = 'weights' with a [payload_weights] entry "
                f"for every kind (e.g. target_kv = 0.7, index_k = 0.15, {kind} = 0.15)")
        return self.slots_per_kind(rank, {kind: slot_bytes}, disk)[kind]

    def slots_per_kind(self, rank: int, slot_bytes: Mapping[str, int], disk: "int | None" = None) -> dict[str, int]:
        """Slots per payload kind (keys: lower-case kind names) of this rank's slabs on ``disk`` (its home disk by
        default); see the module docstring rule (it applies per disk)."""
        if not slot_bytes:
            raise L3ConfigError("payload kinds: the store needs at least one payload kind")
        d = self.disk_for_rank(rank) if disk is None else disk
        budget = self.rank_budget(rank, d)
        if self.payload_weights is None:
            n = budget // sum(slot_bytes.values())
            out = {k: n for k in slot_bytes}
        else:
            for k in slot_bytes:
                if k not in self.payload_weights:
                    raise L3ConfigError(f"payload_weights.{k}: no weight for payload kind {k!r} that the store uses")
            total_w = sum(self.payload_weights.values())  # every declared kind: independent of what is opened
            out = {k: int(budget * self.payload_weights[k] / total_w) // b for k, b in slot_bytes.items()}
        for k, n in out.items():
            if n < 1:
                raise L3ConfigError(
                    f"disks[{d}].budget: rank {rank}'s share ({budget} B) holds no slot of {k} "
                    f"({slot_bytes[k]} B per slot); raise the budget")
        return out

    def slab_dir(self, rank: int, disk: int | None = None) -> str:
        """``<disk>/<deployment>/rank<r>``: one directory per (deployment, rank); slabs of each kind inside."""
        d = self.disk_for_rank(rank) if disk is None else disk
        return os.path.join(self.disks[d].path, self.deployment_id, f"rank{rank}")


def _rank_disks(v: Any, key: str, n_disks: int) -> tuple[int, ...]:
    """One ``ranks.mapping`` entry: a disk index, or a non-empty list of distinct ones (the rank's disks, home
    first)."""
    items = v if isinstance(v, list) else [v]
    if isinstance(v, list) and not v:
        raise L3ConfigError(f"{key}: empty list of disks (give a disk index, or a list of at least one)")
    out: list[int] = []
    for j, x in enumerate(items):
        where = f"{key}[{j}]" if isinstance(v, list) else key
        if isinstance(x, bool) or not isinstance(x, int) or not (0 <= x < n_disks):
            raise L3ConfigError(f"{where}: disk index {x!r} out of range [0, {n_disks})")
        if x in out:
            raise L3ConfigError(f"{where}: disk {x} listed twice for this rank (each disk at most once per rank)")
        out.append(x)
    return tuple(out)


def example_config(dir: str | os.PathLike) -> str:
    """A small valid TOML config whose disk and index live under ``dir``."""
    d = os.path.abspath(os.fspath(dir))
    return f'''# sglang-glm-ext L3 disk tier. Sizes accept integers (bytes) or strings like "64MiB" / "2GB".
deployment_id = "example"
cold_start = "clear"        # "clear" (start empty) | "load" (keep what the index and slabs still agree on)
ack = "write_behind"        # SGLang's write-back answered once pages are staged (durable ms later; a crash in
                            # between loses them) | "durable" (answered once fdatasync'ed and committed)
require_plp = false         # true: refuse a disk that is not known to have power-loss protection
plp = "auto"                # "auto" (ask the block device) | "assume_safe" | "assume_unsafe"
direct_io = "auto"          # "auto" (O_DIRECT, buffered fallback) | "on" | "off"

[[disks]]
path = "{d}/disk0"
budget = "1GiB"

[ranks]
count = 1
mapping = "balanced"        # rank % number of disks | a list, one entry per rank: a disk index or a list of them
                            # ([[0, 1, 2, 3]]: one rank spreads its pages over 4 drives, a [[disks]] entry each;
                            # each disk's budget is split among its ranks) | "all" (every rank on every disk)

[writers]
mode = "spread"             # MLA/DSA pages under CP / attention TP: one owner per page among the node's ranks
                            # (each writes its own mapped disk) | "one_per_node" (the node's first rank writes)

[index]
path = "{d}/index"
map_size = "256MiB"
check = "fast"              # the node's first open proves the index file before mapping it (bit rot must not crash
                            # a server): "fast" (a bounded walk, ~1.2x a load's open) | "full" (also lmdb.verify, ~1.8x)
on_damage = "salvage"       # a damaged index is moved aside (data.mdb.damaged-*) and replaced by every entry the
                            # walk can prove | "reset" (an empty index; its pages become misses)

[gc]
start = 0.90
stop = 0.85
budget_per_round = 64

[queues]
staging_bytes = "256MiB"
max_inflight = 256
wait_ms = 5000              # staging full: a write-back waits this long for room (0: drop at once); ack = "durable":
                            # also the longest it waits for its pages to be durable
write_batch_pages = 32
io_threads = 4
reload_threads = 4
layer_first_reads = "vectored"  # layer-first pages: one read straight into every layer's chunk (least CPU) | "single"
                                # (the slot in one transfer, then copied, 1.2-1.6x the CPU: only where
                                # `sglang-glm-ext l3 bench` shows it faster on your disk)
read_coalesce_bytes = "8MiB"    # pages of one reload in adjacent slots: one read of up to this many bytes (0: a read a
                                # page)
layer_first_gil_pause = "off"   # a layer-first page's checksum holds the GIL, SGLang's scheduler thread waits: "page"
                                # gives it up at each page's end (that wait's p99 2-3x lower, reload CPU 1.1-1.4x) | a
                                # size ("1MiB": also every that many bytes) | "off"

# Sidecar draft pools (non-NextN EAGLE) need every kind sized from the config alone (put payload_split above the
# first table):
# payload_split = "weights"
# [payload_weights]
# target_kv = 0.6
# index_k = 0.15
# draft_kv = 0.15
# draft_index_k = 0.1
'''


def write_example_config(dir: str | os.PathLike, *, force: bool = False) -> str:
    """Write ``l3.toml`` into ``dir`` (created 0700) and return its path. An existing file is never touched unless
    ``force`` (FileExistsError): an operator's edited config is not silently replaced. With ``force`` the new file
    replaces the old one whole (written beside it, then renamed), so a failed write leaves the old one as it was.
    OSError (a file where the directory should be, a read-only file system, no permission) propagates."""
    d = os.path.abspath(os.fspath(dir))
    os.makedirs(d, mode=0o700, exist_ok=True)
    path = os.path.join(d, "l3.toml")
    target = path + ".tmp" if force else path
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (0 if force else os.O_EXCL), 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(example_config(d))
        if force:
            os.replace(target, path)
    except BaseException:
        try:
            os.unlink(target)  # ours either way (O_EXCL, or the .tmp beside it): no half-written config is left
        except OSError:
            pass
        raise
    return path
