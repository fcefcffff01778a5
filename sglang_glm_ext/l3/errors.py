"""The errors the L3 engine raises when it opens something (never on the data path, where a failure is a counted
miss). Each message names the path or config key and what to do."""

from __future__ import annotations

__all__ = ["L3StoreError", "L3OwnerLockedError", "SlabError", "SlabLockedError", "SlabGeometryError",
           "DirectIOUnavailable"]


class L3StoreError(RuntimeError):
    """Open-time failure (bad path, locked slab, PLP refused, budget too small). Never raised on the data path."""


class L3OwnerLockedError(L3StoreError):
    """Another live store owns this (deployment, rank) on this index: in another process, or in this one
    (``in_this_process``: this process has it open with another config, namespace or payload kinds; an open that
    matches gets a handle onto that store instead). ``holder`` is what the owner recorded (pid, host, slab_dir)
    or None."""

    def __init__(self, msg: str, *, holder: "dict | None", in_this_process: bool):
        super().__init__(msg)
        self.holder = holder
        self.in_this_process = in_this_process


class SlabError(RuntimeError):
    """A slab cannot be opened as asked; the message names the path and what to do."""


class SlabLockedError(SlabError):
    pass


class SlabGeometryError(SlabError):
    pass


class DirectIOUnavailable(SlabError):
    pass
