"""One live owner per (deployment, rank) on an index: an exclusive ``flock`` held for a store's lifetime.

A cold start deletes (deployment, rank)'s index entries, so a second live store of the same deployment and rank
on the node's index (each with its own disk directory, which the slab lock cannot see) would delete the first one's
live pages. ``open`` takes this lock before it creates or deletes anything.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import threading
import time

__all__ = ["OwnerLock", "OwnerLockHeld"]


class OwnerLockHeld(OSError):
    """Another live store owns this (deployment, rank) on this index. ``holder``: what the owner wrote (pid, host,
    slab dir, since) or None; ``in_this_process``: the owner is a store of this very process."""

    def __init__(self, msg: str, *, path: str, holder: "dict | None", in_this_process: bool):
        super().__init__(msg)
        self.path = path
        self.holder = holder
        self.in_this_process = in_this_process


# (abspath of the lock file) -> the OwnerLock this process holds on it
_OWNERS: dict[str, "OwnerLock"] = {}
_OWNERS_LOCK = threading.Lock()


class OwnerLock:
    """Exclusive ``flock`` on ``<index.path>/owner-<deployment_id>-rank<r>.lock``, held for a store's lifetime.

    Invariant: while a store of (deployment, rank) is open on an index, it is the only one, on this node and in
    this process. A cold start deletes (deployment, rank)'s index entries, so a second live owner would delete
    the first one's live pages. The kernel drops the lock when its holder dies (SIGKILL
    included), so a crashed server never blocks its restart. ``flock`` belongs to the open file description, so a
    second ``open()`` in the same process conflicts too; the in-process registry only lets the error say so.
    The file's contents (pid, host, slab dir) are for the error message; the lock alone is authoritative.
    """

    def __init__(self, path: str, fd: int, owner: object):
        self.path = path
        self._fd = fd
        self.owner = owner

    @staticmethod
    def path_for(index_path: str, deployment_id: str, rank: int) -> str:
        return os.path.join(os.path.abspath(index_path), f"owner-{deployment_id}-rank{int(rank)}.lock")

    @classmethod
    def acquire(cls, index_path: str, deployment_id: str, rank: int, *, info: dict, owner: object = None
                ) -> "OwnerLock":
        """Take the lock or raise :class:`OwnerLockHeld` naming the live owner. ``index_path`` must exist."""
        path = cls.path_for(index_path, deployment_id, rank)
        what = f"deployment {deployment_id!r} rank {rank} on the L3 index {os.path.dirname(path)!r}"
        with _OWNERS_LOCK:
            mine = _OWNERS.get(path)
            if mine is not None:
                raise OwnerLockHeld(
                    f"{what} is locked by a store already open in this process; open one store per "
                    f"(config, rank) per process and share it (L3Store.open hands out handles onto it)",
                    path=path, holder=_read_holder(path), in_this_process=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                holder = _read_holder(path)
                who = (f"pid {holder.get('pid')} on {holder.get('host')}, slabs in {holder.get('slab_dir')!r}"
                       if holder else "another process")
                raise OwnerLockHeld(
                    f"{what} is locked by a live store ({who}). Two servers on one node that share an index "
                    f"must use different deployment_id values (each then has its own slabs and its own range of "
                    f"the index); a second live owner's cold start would delete the first one's pages",
                    path=path, holder=holder, in_this_process=False) from None
            except BaseException:
                os.close(fd)
                raise
            try:
                data = json.dumps({**info, "pid": os.getpid(), "host": socket.gethostname(),
                                   "since": int(time.time())}, sort_keys=True).encode()
                os.ftruncate(fd, 0)
                os.pwrite(fd, data, 0)
            except OSError:
                pass  # informational only
            lock = cls(path, fd, owner)
            _OWNERS[path] = lock
            return lock

    @staticmethod
    def find(index_path: str, deployment_id: str, rank: int) -> "OwnerLock | None":
        """The lock this process holds for (index, deployment, rank), if any."""
        with _OWNERS_LOCK:
            return _OWNERS.get(OwnerLock.path_for(index_path, deployment_id, rank))

    def release(self) -> None:
        """Idempotent. The file stays (its next owner rewrites it); only the lock goes."""
        with _OWNERS_LOCK:
            if self._fd < 0:
                return
            if _OWNERS.get(self.path) is self:
                del _OWNERS[self.path]
            fd, self._fd = self._fd, -1
            os.close(fd)


def _read_holder(path: str) -> "dict | None":
    try:
        with open(path, "rb") as f:
            d = json.loads(f.read(4096) or b"null")
        return d if isinstance(d, dict) else None
    except (OSError, ValueError):
        return None
