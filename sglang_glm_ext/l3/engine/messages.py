"""What the L3 threads hand each other, typed: every arrow of the pipeline is one of these.

::

    caller    --StagedPage------------------> writer      Staging's write queue; the bytes sit in a staging buffer
    caller    --FreePages/ClearRank/Barrier--> writer      Writer.post; each one is acknowledged, also when it fails
              /AddKind
    caller    --Touch / bad IndexEntry-------> writer      Writer.note_reloads; one slot per page, latest wins
    writer    --[PendingWrite]---------------> committer   a bounded queue: a slow disk stalls the writer, never a caller
    committer --[WriteResult]----------------> writer      the writer alone applies them to the pools and the LRU

Outcomes are enums, never strings to sort by prefix: :class:`Admission` (spill), :class:`WriteOutcome`
(committer), :class:`ReloadMiss` with ``format.BlobCheck`` (reload).
"""

from __future__ import annotations

import enum
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, NamedTuple, Union

from ..disk.aligned import AlignedBuffer
from ..disk.format import PayloadKind
from .index import IndexEntry

if TYPE_CHECKING:
    from .kinds import KindState

__all__ = ["Admission", "StagedPage", "FreePages", "ClearRank", "Barrier", "AddKind", "ControlOp", "Completion", "Touch",
           "Failure", "failure", "PendingWrite", "WriteOutcome", "WriteResult", "ReloadMiss"]


# ---------------------------------------------------------------------- caller -> writer
class Admission(enum.Enum):
    """Staging's answer to one page a caller spills."""

    STAGE = "stage"  # room: copy it into a staging buffer and queue it
    DEDUP = "dedup"  # the same page is staged already: accepted without a copy
    FULL = "full"    # max_inflight pages are in flight: dropped (dropped_staging)


@dataclass(eq=False)
class StagedPage:
    """A page accepted by ``spill`` and not yet finished (durable, deduplicated or failed). ``buf`` holds the
    sealed-to-be slot (header space + payload + zero pad) until the writer finishes it; ``cancelled`` is set by
    ``free`` / ``clear`` and read by the writer and the committer. ``readers`` counts reloads copying out of
    ``buf`` right now; a page finished while it is read is ``retired`` and its last reader releases the buffer."""

    seq: int
    kind: PayloadKind
    content_hash: bytes
    key: bytes  # its index key
    buf: "AlignedBuffer | None"
    cancelled: bool = False
    readers: int = 0
    retired: bool = False
    # Acknowledged to the caller before it is durable (a write-behind spill answered True): counted, with its age,
    # in stats()' acked_not_durable_* until it is finished or cancelled.
    acked: bool = False
    nbytes: int = 0  # payload bytes (what the acknowledged-not-durable bytes add up)
    staged_at: float = 0.0  # time.monotonic() when staged
    finished: bool = False  # the writer finished it (durable, dedup, dropped or failed)
    durable: bool = False  # ...and its page is durable (committed here, or the same page committed first)


class Completion(threading.Event):
    """Set by the writer when a control operation is done; ``ok`` is its outcome."""

    ok = False


@dataclass(frozen=True)
class FreePages:
    kind: PayloadKind
    keys: tuple  # index keys
    hashes: tuple = ()  # their content hashes: the writer clears the pages' free-pending marks once it applied this
    name: ClassVar[str] = "free"


@dataclass(frozen=True)
class ClearRank:
    done: Completion
    name: ClassVar[str] = "clear"


@dataclass(frozen=True)
class Barrier:
    """Complete every commit in flight and run GC back under its watermarks (``flush``)."""

    name: ClassVar[str] = "barrier"


@dataclass(frozen=True)
class AddKind:
    """A payload kind the store added after open (``add_kind``): its slab and pool, loaded already; from now on the
    writer owns them."""

    state: "KindState"
    done: Completion
    name: ClassVar[str] = "add_kind"


ControlOp = Union[FreePages, ClearRank, Barrier, AddKind]


class Touch(NamedTuple):
    """A reload hit: the entry the reader used and when (us). The writer bumps its LRU and persists it."""

    entry: IndexEntry
    at_us: int


# ---------------------------------------------------------------------- writer <-> committer
@dataclass(frozen=True)
class Failure:
    """What a failed write / sync / commit was, as plain data.

    Never an exception object: an exception keeps its traceback, whose frames hold slices of the staging buffer
    (the ``data`` pwrite was given), so the buffer stays exported -- unmappable -- for as long as the exception
    is referenced (a future, a result list, a log record kept by a handler). That made the staging pool's
    next unmap of it fail with BufferError and drop later spills."""

    errno: "int | None"
    message: str

    def __str__(self) -> str:
        return self.message


def failure(e: BaseException) -> Failure:
    return Failure(getattr(e, "errno", None), f"{type(e).__name__}: {e}")


class PendingWrite(NamedTuple):
    page: StagedPage
    state: "KindState"
    slot: int
    written: "Future[Failure | None]"  # the I/O pool's write: None, or its failure


class WriteOutcome(enum.Enum):
    OK = "ok"                    # durable and committed: the page is present
    DEDUP = "dedup"              # another rank or an earlier spill committed the same page first
    WRITE_ERROR = "write_error"  # pwrite or fdatasync failed: the slot goes back
    INDEX_FULL = "index_full"    # the index map is full: nothing of the batch is present, the slot goes back
    INDEX_ERROR = "index_error"  # the file system refused the commit (a full disk) and no entry landed: slot back
    CANCELLED = "cancelled"      # freed or cleared while in flight
    ERROR = "error"              # unknown whether the entry landed (the index cannot even be read): slot kept


class WriteResult(NamedTuple):
    page: StagedPage
    state: "KindState"
    slot: int
    outcome: WriteOutcome
    last_access: int = 0  # the committed entry's last_access (OK)
    failure: "Failure | None" = None


# ---------------------------------------------------------------------- reload
class ReloadMiss(str, enum.Enum):
    """Why a page that has an index entry was not reloaded, beyond the blob checks (``format.BlobCheck``, which
    mean the entry names bytes that are not this page: it is reclaimed)."""

    BAD_DST = "bad_dst"        # the destination cannot take the page in place: reload_bad_dst, the entry stays
    NO_SLAB = "no_slab"        # its slab cannot be opened (not there yet): a plain miss
    SHORT_READ = "short_read"  # the slot lies past its slab's end: the entry is bad, reclaimed
    ERROR = "error"            # an I/O error or a bug: data_path_errors, the entry stays

    def __str__(self) -> str:
        return self.value
