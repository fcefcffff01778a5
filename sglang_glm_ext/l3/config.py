"""L3 configuration: disks, rank->disk mapping, index, cold start, GC watermarks, queue caps, PLP policy.

Loaded from TOML (``tomllib`` / ``tomli``) or JSON. Every bad value is an :class:`L3ConfigError` whose message
starts with the key path (``disks[1].budget: ...``; an unknown key or mode suggests the closest known one), raised
at load time so a server never starts on a config it would later misread. Environment overrides are applied here too,
once (``SGLANG_CP_L3_COLD_START`` replaces ``cold_start`` for one launch), so the engine reads only the config. Each
key's parser, default and doc are one row of ``config_table.py`` (the field defaults below, the example config and
``docs/l3_config_reference.md`` come from it); what spans several keys is checked here, after the rows are
read.

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
from dataclasses import dataclass, field
from typing import Any, Mapping

try:  # Python 3.11+
    import tomllib as _toml
except ModuleNotFoundError:  # pragma: no cover - 3.10
    import tomli as _toml  # type: ignore[no-redef]

from ..declare import EnvVar
# The mode names and parsers are re-exported: the package imports them from here.
from .config_table import (ACK_MODES, COLD_START_MODES, DIRECT_MODES, GIL_PAUSE_PAGE, INDEX_CHECK_MODES,  # noqa: F401
                           INDEX_ON_DAMAGE, KEYS, KIND_NAMES as _KIND_NAMES, LAYER_FIRST_READS, PLP_MODES, WEIGHT,
                           WRITER_MODES, L3ConfigError, default, did_you_mean, example_text, one_of, parse_gil_pause,
                           parse_size, read_keys)

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
        raise L3ConfigError(f"cannot read the L3 config: {e.strerror or e}") from e


def decode(raw: bytes, path: str) -> Any:
    """A config file's data: JSON for a ``.json`` file, TOML otherwise (what :meth:`L3Config.from_file` parses)."""
    if path.endswith(".json"):
        try:
            return json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise L3ConfigError(f"not valid JSON: {e}") from e
    try:
        return _toml.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, _toml.TOMLDecodeError) as e:
        raise L3ConfigError(f"not valid TOML: {e}") from e


_LOADED: dict[tuple, "L3Config"] = {}  # (path, file bytes, env overrides) -> the parsed config (load_once)


@dataclass(frozen=True)
class L3Config:
    """Validated L3 configuration. Build with :meth:`load`, :meth:`from_dict` or :meth:`from_file`. A field read
    from one key has that key's default (``default("queues.wait_ms")``: config_table.py's row, its doc there)."""

    disks: tuple[DiskConfig, ...]
    index_path: str
    index_map_size: int = default("index.map_size")
    num_ranks: int = 1
    index_check: str = default("index.check")
    index_on_damage: str = default("index.on_damage")
    rank_to_disk: tuple[int, ...] = (0,)  # each rank's home disk: the first of rank_to_disks[r]
    rank_to_disks: tuple[tuple[int, ...], ...] = ()  # each rank's disks (home first); () = one each, rank_to_disk
    deployment_id: str = default("deployment_id")
    cold_start: str = default("cold_start")
    ack: str = default("ack")
    require_plp: bool = default("require_plp")
    plp: str = default("plp")
    direct_io: str = default("direct_io")
    gc_start: float = default("gc.start")
    gc_stop: float = default("gc.stop")
    gc_budget_per_round: int = default("gc.budget_per_round")
    staging_bytes: int = default("queues.staging_bytes")
    max_inflight: int = default("queues.max_inflight")
    wait_ms: int = default("queues.wait_ms")
    write_batch_pages: int = default("queues.write_batch_pages")
    io_threads: int = default("queues.io_threads")
    reload_threads: int = default("queues.reload_threads")
    layer_first_reads: str = default("queues.layer_first_reads")
    read_coalesce_bytes: int = default("queues.read_coalesce_bytes")
    layer_first_gil_pause_bytes: int = default("queues.layer_first_gil_pause")  # GIL_PAUSE_PAGE: "page"
    payload_weights: Mapping[str, float] | None = None  # None = equal_slots
    writer_mode: str = default("writers.mode")
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
        base = os.path.dirname(os.path.abspath(path))
        return cls.from_dict(decode(raw, path), source=path, base_dir=base)

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
        """Every key read by its row (config_table.read_keys), then what spans keys (config_table.CROSS_KEY_RULES:
        keep that list in step with the checks here)."""
        if not isinstance(data, Mapping):
            raise L3ConfigError("expected a table at the top level (a JSON object), got "
                                + ("null" if data is None else type(data).__name__))
        override = CP_L3_COLD_START.raw()
        if override and override not in COLD_START_MODES:
            raise L3ConfigError(f"cold_start: unknown mode {override!r} from {CP_L3_COLD_START.name} "
                                f"(expected one of {one_of(COLD_START_MODES)})")
        v = read_keys(data, base_dir)
        fields = {k.field: v[k.path] for k in _FIELD_KEYS}
        if override:  # one launch's choice wins over the file; a caller's explicit open(cold_start=) over both
            fields["cold_start"] = override
        disks = _disks(v["disks"])
        r2ds = _rank_to_disks(v["ranks.count"], v["ranks.mapping"], len(disks))
        if fields["index_check"] == "full" and not _have_lmdb_verify():
            raise L3ConfigError("index.check: 'full' runs py-lmdb's lmdb.verify, which this py-lmdb lacks: install "
                                "lmdb>=3.0 (pip install -U lmdb), or use check = 'fast'")
        gc_start, gc_stop = fields["gc_start"], fields["gc_stop"]
        if not gc_start > gc_stop:
            raise L3ConfigError(f"gc.start: must be greater than gc.stop ({gc_start} <= {gc_stop})")
        if fields["ack"] == "durable" and fields["wait_ms"] == 0:
            raise L3ConfigError("queues.wait_ms: ack = 'durable' answers SGLang once its pages are durable, so it "
                                "needs a wait (e.g. 5000); 0 would answer every write as failed")
        return cls(disks=disks, num_ranks=len(r2ds), rank_to_disk=tuple(ds[0] for ds in r2ds), rank_to_disks=r2ds,
                   payload_weights=_payload_weights(v["payload_split"], data.get("payload_weights")),
                   source=source, test_write_delay_ms=_test_write_delay_ms(), **fields)

    # ------------------------------------------------------------------ derived values
    def check_rank(self, rank: int) -> None:
        if isinstance(rank, bool) or not isinstance(rank, int) or not (0 <= rank < self.num_ranks):
            raise L3ConfigError(f"ranks: rank {rank!r} out of range [0, {self.num_ranks}) "
                                f"(ranks.count / ranks.mapping)")

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


_FIELD_KEYS = tuple(k for k in KEYS if k.field is not None)


def _disks(entries: list[dict[str, Any]]) -> tuple[DiskConfig, ...]:
    disks: list[DiskConfig] = []
    for i, e in enumerate(entries):
        if any(e["disks.path"] == x.path for x in disks):
            raise L3ConfigError(f"disks[{i}].path: {e['disks.path']!r} listed twice")
        disks.append(DiskConfig(e["disks.path"], e["disks.budget"]))
    return tuple(disks)


def _rank_to_disks(count: int | None, mapping: Any, n_disks: int) -> tuple[tuple[int, ...], ...]:
    """Each rank's disks, home first, from ranks.count and ranks.mapping (both already read by their rows)."""
    if isinstance(mapping, str):
        count = count or 1
        if mapping == "all":
            return tuple(tuple(range(n_disks)) for _ in range(count))
        return tuple((r % n_disks,) for r in range(count))
    if count is not None and len(mapping) != count:
        raise L3ConfigError(f"ranks.mapping: has {len(mapping)} entries but ranks.count = {count}")
    if not mapping:
        raise L3ConfigError("ranks.mapping: empty list")
    return tuple(_rank_disks(v, f"ranks.mapping[{i}]", n_disks) for i, v in enumerate(mapping))


def _payload_weights(split: str, weights_raw: Any) -> dict[str, float] | None:
    if split == "equal_slots":
        if weights_raw is not None:
            raise L3ConfigError("payload_weights: set payload_split = 'weights' to use weights")
        return None
    if not isinstance(weights_raw, Mapping) or not weights_raw:
        raise L3ConfigError("payload_weights: payload_split = 'weights' needs a non-empty table")
    weights = {}
    for k, v in weights_raw.items():
        if k not in _KIND_NAMES:
            raise L3ConfigError(f"payload_weights.{k}: unknown payload kind{did_you_mean(k, _KIND_NAMES)} (known: "
                                f"{', '.join(_KIND_NAMES)})")
        weights[k] = WEIGHT.parse(v, f"payload_weights.{k}")
    return weights


def example_config(dir: str | os.PathLike) -> str:
    """A small valid TOML config whose disk and index live under ``dir`` (config_table.example_text)."""
    return example_text(os.path.abspath(os.fspath(dir)))


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
