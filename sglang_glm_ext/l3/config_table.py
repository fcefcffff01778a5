"""The L3 config's keys, one row each (:data:`KEYS`): its TOML path, how its value is read, its default, one line of
doc. Everything else is made from the rows, so each default is written once: ``L3Config``'s field defaults
(:func:`default`), the key-by-key part of ``L3Config.from_dict`` (:func:`read_keys`), the example config
(:func:`example_text`) and the operator's reference ``docs/l3_config_reference.md``
(:func:`reference_markdown`; regenerate it with ``python -m sglang_glm_ext.l3.config_table --reference >
docs/l3_config_reference.md``, a test keeps it current). What spans several keys or entries (a disk listed
twice, ``ranks.mapping`` against the disks, ``payload_weights``: :data:`CROSS_KEY_RULES`) stays explicit code in
``config.py``. A leaf: imports nothing of the package, so ``config.py`` and ``engine/index_check.py`` both take their
mode names from here.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import sys
import textwrap
from dataclasses import dataclass
from typing import Any, Callable, Mapping

__all__ = ["L3ConfigError", "Kind", "Key", "KEYS", "REQUIRED", "default", "key_parser", "read_keys",
           "read_section", "example_text", "reference_markdown", "did_you_mean", "one_of"]


class L3ConfigError(ValueError):
    """A config value is wrong. The message starts with the key path; one about the file as a whole (unreadable, not
    TOML or JSON, not a table) starts with what is wrong, and whoever names the file prefixes it (``l3 fsck``, the
    ``--cp-l3-config`` check). No placeholder and no Python repr of a type or a tuple reaches the reader."""


COLD_START_MODES = ("clear", "load")
INDEX_CHECK_MODES = ("fast", "full")  # engine/index_check.py's CHECK_MODES (it imports these)
INDEX_ON_DAMAGE = ("salvage", "reset")  # engine/index_check.py's ON_DAMAGE
ACK_MODES = ("write_behind", "durable")
WRITER_MODES = ("spread", "one_per_node")  # hicache/cp_writers.py
LAYER_FIRST_READS = ("vectored", "single")
# queues.layer_first_gil_pause = "page": L3Config.layer_first_gil_pause_bytes is this, more than any page, so a
# layer-first checksum gives the GIL up only at each page's end (disk/format.py, checksum_views).
GIL_PAUSE_PAGE = 1 << 62
PLP_MODES = ("auto", "assume_safe", "assume_unsafe")
DIRECT_MODES = ("auto", "on", "off")
PAYLOAD_SPLITS = ("equal_slots", "weights")
KIND_NAMES = ("target_kv", "draft_kv", "index_k", "draft_index_k")
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


# ---------------------------------------------------------------------------------------------- message words
def did_you_mean(word: Any, known) -> str:
    """``; did you mean 'cold_start'?`` for the known name closest to a typo, or "" when none is close."""
    # 0.75: a slip of a letter or two ('cold_star', 'wait_m', 'laod'); a different word gets no guess
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.75) if isinstance(word, str) else []
    return f"; did you mean {close[0]!r}?" if close else ""


def one_of(choices) -> str:
    """``'fast', 'full'``: choices as a config file spells them (a message shows no Python tuple)."""
    return ", ".join(repr(c) for c in choices)


# A value's type as the config file calls it (a TOML table is a Mapping here; JSON's null is None).
_TYPE_WORDS = {Mapping: "table", dict: "table", type(None): "null"}


def _type_word(t: type) -> str:
    return _TYPE_WORDS.get(t, t.__name__)


# ---------------------------------------------------------------------------------------------- value parsers
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


def parse_gil_pause(value: Any, key: str = "queues.layer_first_gil_pause") -> int:
    """queues.layer_first_gil_pause: "page" (GIL_PAUSE_PAGE), "off" / 0 (0), or a byte size of at least 64 KiB (a
    pause after every that many bytes hashed, and at each page's end)."""
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


def typed(v: Any, key: str, types) -> Any:
    """``v`` if it is of ``types`` (a bool only where bool is named), else the key's type error."""
    names = types if isinstance(types, tuple) else (types,)
    want = "/".join(_type_word(t) for t in names)
    if isinstance(v, bool) and bool not in names:
        raise L3ConfigError(f"{key}: expected {want}, got a boolean")
    if not isinstance(v, types):
        got = "null" if v is None else f"{'table' if isinstance(v, Mapping) else type(v).__name__} {v!r}"
        raise L3ConfigError(f"{key}: expected {want}, got {got}")
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


def _deployment(v: Any, key: str) -> str:
    if not _DEPLOYMENT_RE.fullmatch(typed(v, key, str)):
        raise L3ConfigError(
            f"{key}: {v!r} must be a plain name: 1-64 characters of A-Z a-z 0-9 . _ -, starting with "
            f"a letter, a digit or '_' (it names a directory, so '.', '..' and path separators are refused)")
    return v


def _map_size(v: Any, key: str) -> int:
    n = parse_size(v, key)
    if n < 2**20:
        raise L3ConfigError(f"{key}: {n} bytes is too small (>= 1 MiB)")
    return n


def _wait_ms(v: Any, key: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 600_000:
        raise L3ConfigError(f"{key}: expected an integer in [0, 600000] (milliseconds), got {v!r}")
    return v


def _coalesce(v: Any, key: str) -> int:
    n = 0 if v == "0" or (v == 0 and not isinstance(v, bool)) else parse_size(v, key)  # 0: a read a page
    if n > 2**30:
        raise L3ConfigError(f"{key}: at most 1 GiB, got {n} B")
    return n


def _mapping(v: Any, key: str) -> Any:
    """ranks.mapping's shape; config.py checks a list's entries against the disks."""
    if isinstance(v, str) and v not in ("balanced", "all"):
        raise L3ConfigError(f"{key}: unknown mapping {v!r}{did_you_mean(v, ('balanced', 'all'))} (use 'balanced', "
                            f"'all' or a list with one entry per rank: a disk index or a list of disk indices)")
    if not isinstance(v, (str, list)):
        raise L3ConfigError(f"{key}: expected 'balanced', 'all' or a list, got {type(v).__name__}")
    return v


def _payload_split(v: Any, key: str) -> str:
    if typed(v, key, str) not in PAYLOAD_SPLITS:
        raise L3ConfigError(f"{key}: unknown rule {v!r}{did_you_mean(v, PAYLOAD_SPLITS)} (expected 'equal_slots' or "
                            f"'weights')")
    return v


def _weight(v: Any, key: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
        raise L3ConfigError(f"{key}: expected a positive number, got {v!r}")
    return float(v)


def _toml(v: Any) -> str:
    return json.dumps(v, ensure_ascii=False)  # a str, bool or int as TOML writes it


@dataclass(frozen=True)
class Kind:
    """How one key's value is read: ``parse(value, key_path)`` gives what L3Config holds or raises L3ConfigError
    naming the key; ``shows`` is what the reference calls such a value, ``toml`` writes one into a config file."""

    shows: str
    parse: Callable[[Any, str], Any]
    toml: Callable[[Any], str] = _toml
    is_path: bool = False  # a relative one is taken next to the config file


def enum(choices: tuple[str, ...], noun: str = "mode") -> Kind:
    def parse(v: Any, key: str) -> str:
        if typed(v, key, str) not in choices:
            raise L3ConfigError(f"{key}: unknown {noun} {v!r}{did_you_mean(v, choices)} (expected one of "
                                f"{one_of(choices)})")
        return v
    return Kind(" \\| ".join(f'`"{c}"`' for c in choices), parse)


SIZE = Kind('byte size: an integer or a string like `"64MiB"` / `"2GB"`', parse_size)
POS_INT = Kind("integer > 0", _pos_int)
BOOL = Kind("`true` \\| `false`", lambda v, key: typed(v, key, bool))
PATH = Kind("path (a relative one: next to the config file)", lambda v, key: typed(v, key, str), is_path=True)
FRACTION = Kind("number in (0, 1]", _fraction, toml=lambda v: f"{v:.2f}")
DEPLOYMENT = Kind("plain name: 1-64 of `A-Z a-z 0-9 . _ -`, not starting with `.` or `-`", _deployment)
MAP_SIZE = Kind("byte size >= 1 MiB", _map_size)
WAIT_MS = Kind("milliseconds in [0, 600000]", _wait_ms)
COALESCE = Kind("byte size <= 1 GiB, or 0", _coalesce)
GIL_PAUSE = Kind('`"page"` \\| `"off"` (or 0) \\| a byte size in [64 KiB, 1 GiB]', parse_gil_pause)
COUNT = Kind("integer > 0", lambda v, key: None if v is None else _pos_int(v, key))
MAPPING = Kind('`"balanced"` \\| `"all"` \\| a list, one entry per rank', _mapping)
PAYLOAD_SPLIT = Kind(" \\| ".join(f'`"{c}"`' for c in PAYLOAD_SPLITS), _payload_split)
WEIGHT = Kind("number > 0", _weight)


class _Marker:
    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


REQUIRED = _Marker("REQUIRED")  # a key without a default
SAME = _Marker("SAME")  # the example config writes the default
OMIT = _Marker("OMIT")  # the example config leaves the key out


@dataclass(frozen=True)
class Key:
    path: str  # TOML path: "queues.staging_bytes"; "disks.path" is a key of each [[disks]] entry
    field: str | None  # the L3Config field it fills; None: config.py's explicit code reads it
    kind: Kind
    default: Any  # as a config file writes it ("256MiB"); REQUIRED: none; None: unset
    doc: str
    example: Any = SAME  # what the example config writes ("{dir}": the example's directory)

    @property
    def section(self) -> str:
        return self.path.rpartition(".")[0]

    @property
    def name(self) -> str:
        return self.path.rpartition(".")[2]


# Table order is the order from_dict reads the keys in (so the first of several bad values is the one named), the
# example's and the reference's.
# Measured costs behind these defaults (index checks, read modes, the GIL pause): docs_internal/l3_tuning.md.
KEYS: tuple[Key, ...] = (
    Key("deployment_id", "deployment_id", DEPLOYMENT, "default",
        "Names this deployment's directory on every disk (`<disk>/<deployment_id>/rank<r>`) and its owner locks.",
        example="example"),
    Key("cold_start", "cold_start", enum(COLD_START_MODES), "clear",
        '"clear" (start empty) | "load" (keep what the index and slabs still agree on); SGLANG_CP_L3_COLD_START '
        "replaces it for one launch."),
    Key("ack", "ack", enum(ACK_MODES), "write_behind",
        "SGLang's write-back is answered once its pages are staged (durable milliseconds later; a crash in between "
        'loses them) | "durable" (answered once fdatasync\'ed and committed).'),
    Key("require_plp", "require_plp", BOOL, False,
        "true: refuse a disk that is not known to have power-loss protection."),
    Key("plp", "plp", enum(PLP_MODES, "value"), "auto",
        'Power-loss protection: "auto" (ask the block device) | "assume_safe" | "assume_unsafe".'),
    Key("direct_io", "direct_io", enum(DIRECT_MODES, "value"), "auto",
        '"auto" (O_DIRECT, buffered where the file system refuses it) | "on" | "off".'),
    Key("payload_split", None, PAYLOAD_SPLIT, "equal_slots",
        "How a rank's share of a disk is split among payload kinds: the same slot count for every kind opened "
        'together | "weights" (each kind its [payload_weights] share, sized from the config alone: needed for '
        "sidecar draft pools, which are added after open).", example=OMIT),
    Key("disks.path", None, PATH, REQUIRED,
        "The drive's directory for L3; one [[disks]] entry per drive, its index is its position.",
        example="{dir}/disk0"),
    Key("disks.budget", None, SIZE, REQUIRED,
        "Bytes this drive gives to L3, split equally among the ranks mapped to it.", example="1GiB"),
    Key("ranks.count", None, COUNT, None,
        "Number of ranks: 1 if unset, or the length of a list mapping.", example=1),
    Key("ranks.mapping", None, MAPPING, "balanced",
        '"balanced": rank r on disk r % (number of disks) | a list, one entry per rank: a disk index or a list of '
        "them ([[0, 1, 2, 3]]: one rank spreads its pages over 4 drives, a [[disks]] entry each; each disk's budget "
        'is split among its ranks) | "all" (every rank on every disk).'),
    Key("index.path", "index_path", PATH, REQUIRED,
        "Directory of the node's LMDB index (one for every rank and deployment of the node).", example="{dir}/index"),
    Key("index.map_size", "index_map_size", MAP_SIZE, "1GiB",
        "LMDB map size: the most the index file may grow to.", example="256MiB"),
    Key("index.check", "index_check", enum(INDEX_CHECK_MODES), "fast",
        "The node's first open proves the index file before mapping it (bit rot must not crash a server): "
        '"fast" (a bounded walk of its pages) | "full" (also lmdb.verify: more CPU, needs lmdb>=3.0).'),
    Key("index.on_damage", "index_on_damage", enum(INDEX_ON_DAMAGE, "action"), "salvage",
        "A damaged index is moved aside (data.mdb.damaged-*) and replaced by every entry the walk can prove | "
        '"reset" (an empty index; its pages become misses).'),
    Key("gc.start", "gc_start", FRACTION, 0.90,
        "A slab's GC starts when this fraction of its slots is used (must be above gc.stop)."),
    Key("gc.stop", "gc_stop", FRACTION, 0.85, "... and reclaims the coldest pages until this fraction is used."),
    Key("gc.budget_per_round", "gc_budget_per_round", POS_INT, 64, "Pages one GC round reclaims at most."),
    Key("queues.staging_bytes", "staging_bytes", SIZE, "256MiB",
        "Host memory holding accepted pages until they are durable."),
    Key("queues.max_inflight", "max_inflight", POS_INT, 256,
        "Pages accepted and not yet durable at most; a write-back beyond it is dropped."),
    Key("queues.wait_ms", "wait_ms", WAIT_MS, 5000,
        "Staging full: a write-back waits this long for room (0: drop at once); with ack = \"durable\" also the "
        "longest it waits for its pages to be durable."),
    Key("queues.write_batch_pages", "write_batch_pages", POS_INT, 32, "Pages one writer round takes per disk."),
    Key("queues.io_threads", "io_threads", POS_INT, 4, "Write threads per disk."),
    Key("queues.reload_threads", "reload_threads", POS_INT, 4, "Reads in flight per reload call."),
    Key("queues.layer_first_reads", "layer_first_reads", enum(LAYER_FIRST_READS), "vectored",
        "Layer-first pages: one read straight into every layer's chunk (the least CPU) | \"single\" (the slot in "
        "one transfer, then copied: only where `sglang-glm-ext l3 bench` shows it faster on your disk)."),
    Key("queues.read_coalesce_bytes", "read_coalesce_bytes", COALESCE, "8MiB",
        "Pages of one reload in adjacent slots are read in one transfer of up to this many bytes (0: a read a "
        "page); fewer, larger reads cost less CPU."),
    Key("queues.layer_first_gil_pause", "layer_first_gil_pause_bytes", GIL_PAUSE, "off",
        "A layer-first page's checksum holds the GIL while SGLang's scheduler thread waits: \"page\" gives it up at "
        "each page's end (a shorter scheduler wait, more reload CPU) | a size (\"1MiB\": also every that many "
        'bytes) | "off".'),
    Key("writers.mode", "writer_mode", enum(WRITER_MODES), "spread",
        "MLA/DSA pages under CP / attention TP: one owner per page among the node's ranks (each writes its own "
        'mapped disk) | "one_per_node" (the node\'s first rank writes every page).'),
    Key("payload_weights.<kind>", None, WEIGHT, None,
        "With payload_split = \"weights\": a payload kind's share of each rank's budget (" + ", ".join(KIND_NAMES)
        + "); every kind the store opens needs one.", example=OMIT),
)

SECTIONS: dict[str, tuple[Key, ...]] = {}
for _k in KEYS:
    SECTIONS[_k.section] = SECTIONS.get(_k.section, ()) + (_k,)
del _k
ARRAYS = {"disks": "disk"}  # arrays of tables ([[disks]]): what one entry is called
FREE_KEYED = ("payload_weights",)  # a table whose keys are names (payload kinds); config.py reads it
_BY_PATH = {k.path: k for k in KEYS}


def default(path: str) -> Any:
    """The value L3Config holds for a key the config leaves out (None for an unset one)."""
    k = _BY_PATH[path]
    if k.default is REQUIRED:
        raise KeyError(f"{path} has no default")
    return None if k.default is None else k.kind.parse(k.default, path)


def key_parser(path: str) -> Callable[[Any, str], Any]:
    """How the key at ``path`` is read (its row's ``parse(value, key)``): a command option that ends up in a config
    is checked as the config would check it."""
    return _BY_PATH[path].kind.parse


def _resolve(p: str, key: str, base_dir: str | None) -> str:
    if not p:
        raise L3ConfigError(f"{key}: empty path")
    p = os.path.expanduser(p)
    if not os.path.isabs(p):
        if base_dir is None:
            raise L3ConfigError(f"{key}: relative path {p!r} needs an absolute path in a dict config")
        p = os.path.join(base_dir, p)
    return os.path.normpath(p)


def read_section(d: Mapping[str, Any], section: str, where: str, base_dir: str | None) -> dict[str, Any]:
    """The keys of one table (``where`` names it in messages: ``queues``, ``disks[1]``): {path: value}, defaults
    filled in. Unknown keys (but at the top level, which :func:`read_keys` checks) and bad values are refused."""
    rows = SECTIONS[section]
    if where:
        names = [r.name for r in rows]
        for k in d:
            if k not in names:
                raise L3ConfigError(f"{where}.{k}: unknown key{did_you_mean(k, names)} (known: {', '.join(names)})")
    out = {}
    for r in rows:
        key = f"{where}.{r.name}" if where else r.name
        if r.name in d:
            v = r.kind.parse(d[r.name], key)
            out[r.path] = _resolve(v, key, base_dir) if r.kind.is_path else v
        elif r.default is REQUIRED:
            raise L3ConfigError(f"{key}: required key missing")
        else:
            out[r.path] = default(r.path)
    return out


def read_keys(data: Mapping[str, Any], base_dir: str | None) -> dict[str, Any]:
    """Every key of a whole config but [payload_weights] (config.py reads it): {path: value} in table order, and
    for an array of tables {section: [{path: value} per entry]}. A table none of whose keys is required may be left
    out."""
    known = sorted({k.path.split(".")[0] for k in KEYS})
    for k in data:
        if k not in known:
            raise L3ConfigError(f"{k}: unknown key{did_you_mean(k, known)} (known: {', '.join(known)})")
    out: dict[str, Any] = {}
    for section, rows in SECTIONS.items():
        if section in FREE_KEYED:
            continue
        if section and section not in data and any(r.default is REQUIRED for r in rows):
            raise L3ConfigError(f"{section}: required key missing")
        if section in ARRAYS:
            out[section] = _read_array(data.get(section, []), section, base_dir)
        elif not section:
            out.update(read_section(data, section, section, base_dir))
        else:
            d = typed(data[section], section, Mapping) if section in data else {}
            out.update(read_section(d, section, section, base_dir))
    return out


def _read_array(items: Any, section: str, base_dir: str | None) -> list[dict[str, Any]]:
    if not typed(items, section, list):
        raise L3ConfigError(f"{section}: at least one {ARRAYS[section]} is required")
    out = []
    for i, e in enumerate(items):
        where = f"{section}[{i}]"
        if not isinstance(e, Mapping):
            raise L3ConfigError(f"{where}: expected a table with {' and '.join(r.name for r in SECTIONS[section])}")
        out.append(read_section(e, section, where, base_dir))
    return out


# ---------------------------------------------------------------------------------------------- what is made of it
_EXAMPLE_HEAD = '# sglang-glm-ext L3 disk tier. Sizes accept integers (bytes) or strings like "64MiB" / "2GB".'
_EXAMPLE_TAIL = '''
# Sidecar draft pools (non-NextN EAGLE) need every kind sized from the config alone (put payload_split above the
# first table):
# payload_split = "weights"
# [payload_weights]
# target_kv = 0.6
# index_k = 0.15
# draft_kv = 0.15
# draft_index_k = 0.1
'''


def _comment(text: str) -> list[str]:
    """``text`` as comment lines of at most 118 characters, never breaking inside [...] or `...` (a reader copies
    ``[[0, 1, 2, 3]]`` whole)."""
    keep = re.sub(r"\[[^\]]*\]+|`[^`]*`", lambda m: m.group().replace(" ", "\xa0"), text)
    lines = textwrap.wrap(keep, 118, initial_indent="# ", subsequent_indent="# ", break_on_hyphens=False)
    return [ln.replace("\xa0", " ") for ln in lines]


def example_text(d: str) -> str:
    """A small valid config whose disk and index live under the directory ``d``: every key the table does not
    OMIT, each under its doc, at its example value (the default unless the row names one)."""
    out = [_EXAMPLE_HEAD]
    for section, rows in SECTIONS.items():
        rows = [r for r in rows if r.example is not OMIT]
        if not rows:
            continue
        if section:
            out += ["", f"[[{section}]]" if section in ARRAYS else f"[{section}]"]
        for r in rows:
            v = r.default if r.example is SAME else r.example
            if isinstance(v, str):
                v = v.replace("{dir}", d)
            out += _comment(r.doc)
            out.append(f"{r.name} = {r.kind.toml(v)}")
    return "\n".join(out) + "\n" + _EXAMPLE_TAIL


_SECTION_DOCS = {
    "": ("Top level", "Top-level keys; put them above the first table."),
    "disks": ("`[[disks]]`", "One entry per drive, at least one; a drive's index (`ranks.mapping`) is its position."),
    "ranks": ("`[ranks]`", "Which disks each rank writes (`rank_budget`: a disk's budget split among its ranks)."),
    "writers": ("`[writers]`", "Who writes a page every rank of a node holds."),
    "index": ("`[index]`", "The node's LMDB index: required."),
    "gc": ("`[gc]`", "Page-level LRU GC per slab, between two watermarks."),
    "queues": ("`[queues]`", "Write-back staging, writer and reload threads."),
    "payload_weights": ("`[payload_weights]`", "Only with `payload_split = \"weights\"`; its keys are payload kinds."),
}
# The checks config.py's from_dict makes after reading the keys one by one.
CROSS_KEY_RULES = (
    "`SGLANG_CP_L3_COLD_START` (`clear` or `load`), when set, replaces `cold_start` for that launch.",
    "Two `[[disks]]` entries may not name the same path.",
    "A list `ranks.mapping` has `ranks.count` entries (when both are set), each a disk index in range or a "
    "non-empty list of distinct ones.",
    '`index.check = "full"` needs py-lmdb\'s `lmdb.verify` (lmdb>=3.0).',
    "`gc.start` must be greater than `gc.stop`.",
    '`ack = "durable"` needs `queues.wait_ms` > 0.',
    '`[payload_weights]` needs `payload_split = "weights"`, which needs a non-empty `[payload_weights]`.',
)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def reference_markdown() -> str:
    """docs/l3_config_reference.md: every key, its value, default and doc, section by section."""
    out = ["# L3 config reference", "",
           "<!-- Generated from sglang_glm_ext/l3/config_table.py: python -m sglang_glm_ext.l3.config_table "
           "--reference > docs/l3_config_reference.md -->", "",
           "The file `--cp-l3-config` names (TOML, or JSON for a `.json` file); `sglang-glm-ext l3 example-config "
           "--dir DIR` writes a valid one. A bad value stops the load with an error that starts with its key "
           "(`queues.wait_ms: ...`). Measured costs behind the defaults: `docs_internal/l3_tuning.md`."]
    for section, rows in SECTIONS.items():
        title, intro = _SECTION_DOCS[section]
        out += ["", f"## {title}", "", intro, "", "| key | value | default | what it sets |", "|---|---|---|---|"]
        for r in rows:
            dflt = ("required" if r.default is REQUIRED else "unset" if r.default is None
                    else f"`{r.kind.toml(r.default)}`")
            out.append(f"| `{r.path}` | {r.kind.shows} | {dflt} | {_cell(r.doc)} |")
    out += ["", "## Checks across keys", ""] + [f"* {rule}" for rule in CROSS_KEY_RULES]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    if sys.argv[1:] != ["--reference"]:
        sys.exit("usage: python -m sglang_glm_ext.l3.config_table --reference > docs/l3_config_reference.md")
    sys.stdout.write(reference_markdown())
