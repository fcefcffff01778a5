"""What the L3 bench reads of the engine under test beyond the caller API: the read path's mode, counters and
alignment, and the slabs it punches for a first fill. Today's engine offers them through ``L3Store.diagnostics()``;
an older one (benchmark/l3_ab.py's "before" side) only through its private attributes, read here and nowhere else,
and what it lacks reads as None. Loaded from beside ``bench.py``."""

from __future__ import annotations

import sys


class ReadPath:
    """The engine's reload path as the bench sees it. ``vectored``: None where the engine has one layer-first
    read mode; ``helpers``: None where it hashes on its reader threads; ``hand_off_below``: None where it has no
    threshold from which each reader hashes its own page."""

    def __init__(self, store):
        diag = getattr(store, "diagnostics", None)
        if diag is not None:
            self._reads = diag()
            self.helpers = self._reads.hash_helpers
            module = sys.modules.get("sglang_glm_ext.l3.engine.reload")
        else:  # an engine from before diagnostics(): its reader object, where it had one
            self._reads = getattr(store, "_reloader", None) or getattr(store, "_reads", None)
            self.helpers = getattr(self._reads, "helpers", None)
            module = sys.modules.get(type(self._reads).__module__)
        self.hand_off_below = getattr(module, "HAND_OFF_BELOW", None)
        self.default = getattr(self._reads, "vectored", None)

    def set_vectored(self, on: "bool | None") -> None:
        """Read layer-first pages vectored (True) or as one transfer (False) from now on; None: the default."""
        if self.default is not None:
            self._reads.vectored = self.default if on is None else on

    def io_counters(self) -> dict:
        return self._reads.io_counters() if hasattr(self._reads, "io_counters") else {}

    def alignment(self) -> "dict | str":
        return self._reads.alignment() if hasattr(self._reads, "alignment") else "n/a (this engine)"


def slabs_of(store, kind) -> list:
    """The kind's slab states (each with ``slab`` and ``num_slots``); [] where the engine does not say."""
    diag = getattr(store, "diagnostics", None)
    if diag is not None:
        return list(diag().slabs(kind))
    try:  # an engine from before diagnostics()
        return list(store._kinds[kind].parts)
    except (AttributeError, KeyError, TypeError):
        return []


def unwritten_again(store, kind) -> bool:
    """Punch every slot of the (cleared) store's slabs of ``kind`` and preallocate them again, as the store makes a
    new slab: their next writes fill unwritten extents (a first fill). False where the engine under test has no way
    to (an older one) or the file system cannot punch."""
    parts = slabs_of(store, kind)
    if not parts:
        return False
    try:
        for st in parts:
            if st.slab.punch(range(st.num_slots)) != st.num_slots:
                return False
            st.slab.reserve(st.num_slots)
        return True
    except (AttributeError, KeyError, TypeError, OSError):
        return False
