"""No bytes in the index file may crash the process that opens it.

LMDB maps ``data.mdb`` and trusts every page number, offset and length in it: a flipped byte can send the engine past
the end of the file (SIGBUS), outside the map (SIGSEGV) or into an assertion (SIGABRT), at open, in the cold-start
walk, in a lookup or in a later write, and no caller can catch a signal. So a process must not map a file nobody has
proven sound, and the proof must be made by code that cannot crash on it. This module makes it, around a process's
first ``lmdb.open`` of an index (:func:`guarded`, called by ``L3Index.open``), with its two rooms: ``index_walk.py``
(the bounded page walker) and ``index_salvage.py`` (what a damaged file keeps, and the rebuild). The three import only
the standard library, ``lmdb`` and the config's mode names (``config_table``, standard library only).

1. **Gate** (node-wide: the index is one file for every rank and deployment of the node). ``flock(index.gate)``,
   held from before the check until this process's own ``lmdb.open`` returned, serialises the first opens of every
   process of this build. Whether anybody has the environment open is LMDB's own test: every opener (any build, any
   tool) holds a POSIX read lock on byte 0 of ``lock.mdb``. A process that gets that byte exclusively is alone: it
   checks (and repairs) the file while holding it, so any LMDB opener waits in its open. Otherwise live processes
   have it mapped: the first of them proved it, every write since was made by LMDB in such processes, so it is not
   checked again (``in_use``), nor could it be replaced under their maps.
2. **Check** (:func:`check_index`) by byte walkers that never map the file and bound every read (pread; page
   numbers, offsets and lengths checked against the page and the file; the visited-page bitmap sized by the file,
   never by a field):
   * ``fast`` (default): the schema-exact walk (``salvage_records(collect=False)``) -- both meta pages as LMDB's open
     requires them and the committed one provably the newest (its commit's own freed pages are in its freeDB under
     its txnid: a txnid a flip raised, which LMDB would take for the newest, a silent rollback of one commit, fails);
     the freeDB, main DB and ``pages`` trees: every page reached once, never a free one, its own page number, every
     node inside its page, every record the index's 57-byte key / 16-byte value, keys in order and inside their
     parent's separator bounds, each DB record's counters equal to what the walk found. ~0.35 s per million entries;
   * ``full``: also py-lmdb's offline verifier ``lmdb.verify`` (py-lmdb >= 3.0; seek/read only; every engine
     invariant, including that live and free pages cover the file) in a child process beside the walk. ~1.3 s per
     million entries more CPU.
3. **Damaged** (``on_damage``): the file is moved aside (``data.mdb.damaged-<utc>-<pid>``, never deleted: the
   operator may inspect it) and a fresh index is written with every record that can be proven (``salvage``, the
   default: :func:`salvage_records`) or none (``reset``); ``refuse`` (fsck without ``--repair``, read-only opens)
   changes nothing and raises :class:`Damaged` with the findings and what a salvage would keep.

What a salvage keeps: the records of the committed tree's leaves that the bounded walk finds sound, reachable through
sound branch pages and inside their parent's key bounds; plus, when the free list walked clean, leaves that are
neither reachable nor free (at rest every page is one or the other: such a leaf was live until a pointer to it was
damaged). Never a page the freeDB names (an old copy of a leaf: it holds entries a ``clear``, ``free`` or GC deleted,
and such a blob still verifies byte-exact, so nothing downstream could catch its return), never a page reached
twice, never the older meta's snapshot. Which meta is the newest is decided by two witnesses per page that no one
flip can both change -- its txnid field and what its trees say (a commit's own freed pages are its freeDB's highest
record, keyed by its txnid) -- paired across the two pages as LMDB writes them (commit ``t`` on page ``t & 1``, the
pages holding consecutive commits), also for a page whose flags, magic or version a flip changed; when no pairing,
or more than one, names a page, it is not established and nothing is kept (``index_walk.newest_meta``). Slabs are never
scanned to rebuild entries: a slot's header has no epoch, so a blob a ``clear`` dropped is indistinguishable from a
live one (l3_design.md, "A damaged index").

Entries stay pointers: every reload verifies the slot's header (kind, content hash, namespace + deployment digest)
and the payload checksum, so a damaged entry that survived is a miss, never wrong bytes.

The walkers know LMDB 0.9's file layout on a 64-bit little-endian host (as ``lmdb.verify`` does); a file of another
layout (an LMDB 1.0 environment) fails the meta check and is treated as damaged.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import struct
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field

# The config's index.check / index.on_damage values (a server's open); tools may also "refuse" a damaged index.
from ..config_table import INDEX_CHECK_MODES as CHECK_MODES, INDEX_ON_DAMAGE as ON_DAMAGE
from .index_salvage import rebuild_index, salvage_records

__all__ = ["CHECK_MODES", "ON_DAMAGE", "GATE_FILE", "Verdict", "Damaged", "check_index", "salvage_records",
           "rebuild_index", "guarded"]

GATE_FILE = "index.gate"
GATE_TIMEOUT_S = 600.0  # a first opener checks ~1-3 s per million entries (full); the others wait this long at most


@dataclass
class Verdict:
    """What the guard found and did at a process's first open of an index."""

    action: str  # "verified" | "in_use" (live processes have it open) | "new" | "salvaged" | "reset"
    reason: str = ""
    problems: list = field(default_factory=list)  # the check's findings (damaged files; at most 20)
    kept: int = 0  # salvaged: the entries the new index holds
    claimed: int = 0  # salvaged: the entries the damaged file's pages DB record claimed (itself perhaps damaged)
    moved_to: str = ""  # salvaged / reset: where the damaged file went
    seconds: dict = field(default_factory=dict)

    @property
    def repaired(self) -> bool:
        return self.action in ("salvaged", "reset")

    def as_dict(self) -> dict:
        return asdict(self)


class Damaged(OSError):
    """The index is damaged and ``on_damage = "refuse"``: nothing was changed. ``records`` is what a salvage would
    keep (sorted (key, value) pairs, read with pread), ``claimed`` the entry count the file's own record claims."""

    def __init__(self, reason: str, problems: list, records: list, claimed: int):
        super().__init__(reason)
        self.reason, self.problems, self.records, self.claimed = reason, problems, records, claimed


# ------------------------------------------------------------------------------------------------ the check
_VERIFY_CHILD = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from lmdb import verify
try:
    print(json.dumps(verify.verify(sys.argv[2], subdir=True)))
except verify.VerifyError as e:
    print(json.dumps(["unverifiable: %s" % e]))
"""


def _verifier_child(path: str) -> subprocess.Popen:
    """``lmdb.verify`` in a child that imports only the lmdb binding this process runs (``-I``: no user site, no
    environment, no project code) and prints its findings as JSON."""
    import importlib.util

    import lmdb
    if importlib.util.find_spec("lmdb.verify") is None:  # the config refuses "full" then; a direct caller learns here
        raise OSError("L3 index: index.check = 'full' runs lmdb.verify, which this py-lmdb lacks (needs lmdb>=3.0)")
    where = os.path.dirname(os.path.dirname(os.path.abspath(lmdb.__file__)))
    return subprocess.Popen([sys.executable, "-I", "-c", _VERIFY_CHILD, where, path], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, close_fds=True)


def check_index(path: str, mode: str = "fast", timeout: float = GATE_TIMEOUT_S) -> "tuple[bool, list[str]]":
    """(sound, findings) for the index directory ``path``, which nobody may be writing (the guard holds LMDB's
    exclusive lock). Never raises for any file content; OSError where the check itself cannot run (``data.mdb``
    cannot be opened, the verifier child cannot start or was killed): then nothing may be concluded, nor replaced."""
    if mode not in CHECK_MODES:
        raise ValueError(f"index check mode {mode!r}: expected one of {CHECK_MODES}")
    proc = _verifier_child(path) if mode == "full" else None
    try:
        _, info = salvage_records(os.path.join(path, "data.mdb"), collect=False)
        problems = list(info["problems"])
        if not problems and info["walked"] != info["claimed"]:
            problems.append(f"the walk found {info['walked']} entries, the pages DB record claims {info['claimed']}")
        if problems or proc is None:
            return not problems, problems
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False, [f"lmdb.verify did not finish in {timeout:g} s"]
        if proc.returncode < 0:  # pure Python cannot fault on a file: the machine killed it (OOM), not damage
            raise OSError(f"L3 index {path}: the lmdb.verify child was killed by signal {-proc.returncode}")
        if proc.returncode != 0:
            return False, [f"lmdb.verify failed (exit {proc.returncode}): {err.strip()[-300:]}"]
        try:
            found = json.loads(out)
        except ValueError:
            return False, [f"lmdb.verify answered no findings list: {out[-200:]!r}"]
        return not found, [f"lmdb.verify: {p}" for p in found]
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()


# ------------------------------------------------------------------------------------------------ the gate
def _lock(fd: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def _alone(path: str) -> "int | None":
    """LMDB's own "first opener" test: every process with the environment open holds a POSIX read lock on byte 0 of
    ``lock.mdb`` (mdb_env_excl_lock), whatever its build or tool. An fd holding that byte exclusively means nobody
    has it open, and while it is held any LMDB opener waits in its open. None: someone has it open.

    Only for a process that does not have the environment open itself (POSIX locks are per process, and closing any
    fd of the file drops them): L3Index.open calls the guard only for its process's first open of the path."""
    fd = os.open(os.path.join(path, "lock.mdb"), os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
        return fd
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EACCES, errno.EAGAIN):
            return None
        raise


def _require_known_layout() -> None:
    """The walkers read LMDB 0.9's file layout on a 64-bit little-endian host. Another engine (py-lmdb can be built
    with LMDB 1.0, whose files differ) would have every file refused as damaged and replaced at every start: refuse
    to open instead, with the fix."""
    import lmdb
    ver = lmdb.version()
    if ver[:2] != (0, 9) or sys.byteorder != "little" or struct.calcsize("P") != 8:
        raise OSError(f"L3 index: this py-lmdb runs LMDB {'.'.join(map(str, ver))} on a "
                      f"{struct.calcsize('P') * 8}-bit {sys.byteorder}-endian host; the index check reads LMDB "
                      f"0.9's file layout on 64-bit little-endian hosts only: install an lmdb wheel built with its "
                      f"default LMDB 0.9 engine (pip install --force-reinstall 'lmdb>=3.0')")


def _has_data(path: str) -> bool:
    try:
        return os.path.getsize(os.path.join(path, "data.mdb")) > 0
    except FileNotFoundError:
        return False


@contextlib.contextmanager
def guarded(path: str, *, check: str = "fast", on_damage: str = "salvage", map_size: int = 1 << 30,
            timeout: float = GATE_TIMEOUT_S, log=None):
    """Wrap a process's first ``lmdb.open`` of the index directory ``path`` (which must exist): yields the
    :class:`Verdict` once the file the open will map is proven sound (checked, repaired, new, or in use by live
    processes), and holds the node's gate until the block ends, so the next process finds this one's open and does
    not check again. Raises :class:`Damaged` (``on_damage = "refuse"``) or OSError (the gate, a file that cannot be
    opened, a repair that could not be written: then nothing was changed)."""
    if on_damage not in ON_DAMAGE + ("refuse",):
        raise ValueError(f"on_damage {on_damage!r}: expected one of {ON_DAMAGE + ('refuse',)}")
    if check not in CHECK_MODES:
        raise ValueError(f"index check mode {check!r}: expected one of {CHECK_MODES}")
    _require_known_layout()
    if not _has_data(path):  # LMDB makes a new environment: nothing to prove (a zero-length file is LMDB's "new" too)
        yield Verdict("new", "no data yet")
        return
    gate = os.open(os.path.join(path, GATE_FILE), os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        if not _lock(gate, timeout):
            raise OSError(errno.ETIMEDOUT, f"L3 index {path}: another process has held {GATE_FILE} (checking the "
                                           f"index) for more than {timeout:g} s")
        held = _alone(path)
        if held is None:
            yield Verdict("in_use", "live processes have it open (the first of them checked it)")
            return
        try:
            verdict = _check_and_repair(path, check, on_damage, map_size, timeout, log)
        finally:
            os.close(held)  # the next opener (this process's, in the block) is LMDB's exclusive one: it resets lock.mdb
        yield verdict
    finally:
        os.close(gate)


def _check_and_repair(path: str, mode: str, on_damage: str, map_size: int, timeout: float, log) -> Verdict:
    t0 = time.perf_counter()
    if not _has_data(path):
        return Verdict("new", "no data yet")
    try:
        ok, problems = check_index(path, mode, timeout)
    except OSError:
        raise  # the check itself could not run: an operational error, nothing concluded about the file
    except Exception as e:  # the walkers bound every read; anything left is a finding, never a failed open
        ok, problems = False, [f"the check stopped: {type(e).__name__}: {e}"]
    t1 = time.perf_counter()
    if ok:
        if log is not None:
            log.info("L3 index %s: checked (%s) in %.2f s: sound", path, mode, t1 - t0)
        return Verdict("verified", f"sound ({mode} check)", seconds={"check": t1 - t0})
    reason = "; ".join(problems[:3]) + (f" (+{len(problems) - 3} more)" if len(problems) > 3 else "")
    records, info = salvage_records(os.path.join(path, "data.mdb"))  # under "reset" too: what it claimed, for the log
    t2 = time.perf_counter()
    claimed = int(info.get("claimed", 0))
    if on_damage == "refuse":
        raise Damaged(reason, problems[:20], records, claimed)
    if on_damage == "reset":
        records = []
    moved = os.path.join(path, f"data.mdb.damaged-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{os.getpid()}")
    try:
        rebuild_index(path, records, map_size, moved)
    except Exception as e:
        if isinstance(e, OSError):
            raise
        raise OSError(f"L3 index {path} is damaged ({reason}) and its repair could not be written: "
                      f"{type(e).__name__}: {e}") from e
    t3 = time.perf_counter()
    v = Verdict("salvaged" if on_damage == "salvage" else "reset", reason, problems[:20], kept=len(records),
                claimed=claimed, moved_to=moved, seconds={"check": t1 - t0, "salvage": t2 - t1, "rebuild": t3 - t2})
    if log is not None:
        log.error("L3 index %s was damaged (%s): moved to %s; the new index keeps %d of the %d entries the damaged "
                  "file claimed (%s; the rest are misses, never wrong bytes)", path, reason, moved, v.kept, claimed,
                  "what the check could prove" if on_damage == "salvage" else "index.on_damage = reset")
    return v
