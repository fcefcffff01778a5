"""Directory helpers shared by the slabs, the sidecars and the index.

Two rules:

* Create what is missing owner-only; never re-permission what exists. An existing directory may be an operator's
  mount point, a directory shared with other tools, or a parent several deployments live under: its mode is the
  operator's decision. Directories this code creates hold cached prompt data (slabs) or the node's commit record
  (the index), so they are 0700 whatever the umask.
* A created file or directory is durable only once its parent directory is fsynced: fsync of the file itself
  makes its data durable, not the name that leads to it.
"""

from __future__ import annotations

import os

__all__ = ["make_private_dirs", "fsync_dir"]


def make_private_dirs(path: str) -> list[str]:
    """Create the missing directories of ``path`` (``path`` included) 0700; return them, outermost first.

    Each is chmod-ed right after its own mkdir, so the umask cannot make it differ from 0700 (``os.makedirs``
    gives intermediate directories 0777 & ~umask). Existing directories are left exactly as they are. The
    parent of every directory created here is fsynced, so the new names survive a power cut.
    """
    path = os.path.abspath(path)
    missing = []
    d = path
    while not os.path.isdir(d):
        missing.append(d)
        parent = os.path.dirname(d)
        if parent == d:
            break
        d = parent
    created = []
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            continue  # another process created it first: theirs, left alone
        os.chmod(d, 0o700)
        created.append(d)
    for d in created:  # each new name lives in its parent's directory data
        fsync_dir(os.path.dirname(d))
    return created


def fsync_dir(path: str) -> None:
    """fsync a directory so the entries created / renamed in it are durable. Raises OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
