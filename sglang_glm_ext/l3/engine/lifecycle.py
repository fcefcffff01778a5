"""A store's life: open (owner lock -> slab directories -> PLP -> slabs + sidecars -> index -> cold start -> staging,
readers, writer), a kind added later, and close. Functions over the one ``SharedStore`` (shared.py) they fill in;
the order is the crash-safety argument's (docs_internal/l3_design.md), so it is written once, here."""

from __future__ import annotations

import dataclasses
import errno
import itertools
import logging
import os
from typing import Mapping

from . import coldstart, slab_set
from ..config import L3Config, L3ConfigError
from ..disk.format import Namespace, PayloadKind, slot_bytes_for
from ..disk.fsutil import make_private_dirs
from ..disk.owner_lock import OwnerLock, OwnerLockHeld
from ..disk.slab import check_plp, probe_plp
from ..errors import L3OwnerLockedError, L3StoreError
from .index import L3Index
from .kinds import KindDisks, KindState
from .messages import AddKind, Completion
from .reload import Reloader
from .staging import StagedPages, StagingPool
from .writer import Writer

log = logging.getLogger(__name__)


def parse_kinds(page_bytes: Mapping[PayloadKind | str, int]) -> dict[PayloadKind, int]:
    kinds: dict[PayloadKind, int] = {}
    for k, n in page_bytes.items():
        try:
            kind = PayloadKind.parse(k)
        except ValueError as e:
            raise L3ConfigError(f"page_bytes: {e}") from None
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            raise L3ConfigError(f"page_bytes.{kind.label}: expected a positive int, got {n!r}")
        kinds[kind] = n
    if not kinds:
        raise L3ConfigError("page_bytes: at least one payload kind is required")
    return kinds


def kinds_text(kinds: Mapping[PayloadKind, int]) -> str:
    return ", ".join(f"{k.label}={n} B" for k, n in sorted(kinds.items()))


def open_store(s, kinds: dict[PayloadKind, int], mode: str) -> None:
    """Everything ``s`` holds, opened: one live owner per (deployment, rank) on an index, taken before anything is
    created or deleted for it; nothing stays open if a step fails."""
    config, rank = s.config, s.rank
    slot_bytes = {k: slot_bytes_for(n) for k, n in kinds.items()}
    nslots = {d: config.slots_per_kind(rank, {k.label: b for k, b in slot_bytes.items()}, d) for d in s.disks}
    sdir = config.slab_dir(rank)
    try:
        make_private_dirs(config.index_path)
        s.owner = OwnerLock.acquire(config.index_path, config.deployment_id, rank, owner=s,
                                    info={"slab_dir": sdir, "deployment_id": config.deployment_id, "rank": rank})
    except OwnerLockHeld as e:
        raise L3OwnerLockedError(str(e), holder=e.holder, in_this_process=e.in_this_process) from None
    except OSError as e:
        raise L3StoreError(f"index.path: cannot take the owner lock for rank {rank} in "
                           f"{config.index_path!r}: {e}") from e
    try:
        _open_owned(s, kinds, slot_bytes, nslots, mode)
    except BaseException:
        close_files(s)
        raise


def _check_disks(s) -> None:
    """Each disk's slab directory, writable, and its power-loss protection: decided once per disk, loud when
    require_plp and the disk is not known safe."""
    config = s.config
    s.plps = {}
    for d in s.disks:
        ddir = config.slab_dir(s.rank, d)
        try:
            # Before the PLP probe, which must see the disk's own device. Missing directories owner-only;
            # existing ones (the configured disk path, a pre-made deployment directory) keep their mode.
            make_private_dirs(ddir)
            if not os.access(ddir, os.W_OK):
                raise PermissionError(errno.EACCES, "not writable", ddir)
        except OSError as e:
            raise L3StoreError(f"disks[{d}].path: cannot create slab directory {ddir!r}: {e}") from e
        try:
            s.plps[d] = probe_plp(config.disks[d].path, plp=config.plp)
            check_plp(s.plps[d], config.require_plp)
        except Exception as e:
            raise L3StoreError(f"disks[{d}]: power-loss protection check failed: {e}") from e
    s.plp = s.plps[s.disk]


def _open_owned(s, kinds: dict[PayloadKind, int], slot_bytes, nslots, mode: str) -> None:
    """The rest of open, run once ``s`` owns (deployment, rank): slabs, PLP, index, cold start, threads."""
    config, rank = s.config, s.rank
    _check_disks(s)
    s.seq = itertools.count(1)  # one LRU push order across the kinds
    prior_meta: dict[tuple[PayloadKind, int], dict | None] = {}  # each slab's sidecar as its last owner left it
    try:
        for kind, pb in kinds.items():
            s.kinds[kind] = open_kind(s, kind, pb, slot_bytes[kind], {d: n[kind.label] for d, n in nslots.items()},
                                      prior_meta)
        s.index = L3Index.open(config.index_path, config.index_map_size, check=config.index_check,
                               on_damage=config.index_on_damage)
    except Exception as e:
        close_files(s)
        if isinstance(e, (L3StoreError, L3ConfigError)):
            raise
        raise L3StoreError(f"L3 store open failed for rank {rank}: {type(e).__name__}: {e}") from e

    # Cold start runs single-threaded, BEFORE the writer exists: the writer is the sole pool/LRU owner after.
    # Entries of kinds the config sizes alone but that are not open yet wait for add_kind (load_kind).
    deferred = [k for k in map(PayloadKind.parse, config.addable_kinds) if k not in s.kinds]
    try:
        done = coldstart.apply(mode, s.index, s.keys, rank, s.kinds, prior_meta, deferred)
        for grp in s.kinds.values():  # slabs of other page sizes: emptied ones go, the capacity is settled
            for st in grp.parts:
                slab_set.settle(st, punch=True)
    except Exception as e:
        close_files(s)
        if isinstance(e, L3StoreError):
            raise
        raise L3StoreError(f"cold_start={mode}: failed for rank {rank}: {type(e).__name__}: {e}") from e
    s.loaded_pages, s.stale_dropped = done.loaded_pages, done.stale_dropped
    s.other_namespace_pages = done.other_pages

    s.staging = StagingPool(config.staging_bytes, slot_bytes)
    s.staged = StagedPages(s.staging, max_inflight=config.max_inflight,
                           batch_pages=config.write_batch_pages * len(s.disks))
    s.reloader = Reloader(config, rank, s.kinds, s.ns, index=s.index, keys=s.keys, staged=s.staged, counters=s.c,
                          warn_once=s.warn_once, note_reloads=lambda *a: s.writer.note_reloads(*a))
    s.writer = Writer(config, rank=rank, keys=s.keys, index=s.index, kinds=s.kinds, staged=s.staged, counters=s.c)
    s.writer.start()


def open_kind(s, kind: PayloadKind, page_bytes: int, slot_bytes: int, num_slots: Mapping[int, int],
              prior_meta: dict) -> KindDisks:
    """This rank's slab of one kind on each of its disks and the slabs of other slot sizes beside each
    (slab_set.py); each slab's sidecar as the previous owner left it goes into ``prior_meta[(kind, disk)]`` (a
    ``load`` keeps a slab's entries only if it vouches for them). Nothing stays open if one disk fails."""
    states: list[KindState] = []
    try:
        for d in s.disks:
            st, prior_meta[(kind, d)] = slab_set.open_kind(
                s.config, rank=s.rank, disk=d, kind=kind, page_bytes=page_bytes, slot_bytes=slot_bytes,
                num_slots=num_slots[d], ns_digest=s.ns, seq=s.seq)
            states.append(st)
            if s.config.test_write_delay_ms:
                log.warning("L3 rank %d %s disk %d: TEST-ONLY slow disk, every slab write sleeps %d ms "
                            "(SGLANG_GLM_EXT_L3_TEST_WRITE_DELAY_MS)", s.rank, kind.label, d,
                            s.config.test_write_delay_ms)
                st.slab.inject_write_fault(s.slow_write(s.config.test_write_delay_ms / 1000.0))
    except BaseException:
        for st in states:
            slab_set.close_kind(st)
        raise
    return KindDisks(states)


def add_kind(s, kind, page_bytes: int, timeout: float) -> None:
    """``SharedStore.add_kind`` (its docstring states the promise), under ``s.add_lock``."""
    kind = parse_kinds({kind: page_bytes}).popitem()[0]
    with s.add_lock:
        st = s.kinds.get(kind)
        if st is not None:
            if st.page_bytes != page_bytes:
                raise L3StoreError(f"payload kind {kind.label} is open with {st.page_bytes} B pages; "
                                   f"{page_bytes} B asked (one geometry per kind and namespace)")
            return
        if s.closed:
            raise L3StoreError(f"rank {s.rank}'s L3 store is closed; cannot add {kind.label}")
        sb = slot_bytes_for(page_bytes)
        n = {d: s.config.slots_for_kind(s.rank, kind.label, sb, d) for d in s.disks}
        prior: dict = {}
        try:
            state = open_kind(s, kind, page_bytes, sb, n, prior)
        except (L3StoreError, L3ConfigError):
            raise
        except Exception as e:
            raise L3StoreError(f"add_kind {kind.label} for rank {s.rank}: {type(e).__name__}: {e}") from e
        try:
            loaded = _hand_over(s, kind, state, sb, prior, timeout)
        except BaseException:
            if kind not in s.kinds:
                for st in state.parts:
                    slab_set.close_kind(st)
            raise
        s.loaded_pages += loaded


def _hand_over(s, kind: PayloadKind, state: KindDisks, sb: int, prior: dict, timeout: float) -> int:
    """A new kind's durable pages kept (``load``), its staging and readers, then the writer takes the pool over
    through its control queue, so it stays the pools' only owner. The pages kept."""
    loaded = 0
    if s.cold_start == "load":
        loaded = coldstart.load_kind(s.index, s.keys, s.rank, state, prior).loaded_pages
    for st in state.parts:
        slab_set.settle(st, punch=True)  # (under clear the open already deleted the rank's entries)
    s.staging.add_kind(kind, sb)
    s.reloader.add_kind(kind, sb)
    done = Completion()
    s.writer.post(AddKind(state, done))
    if not done.wait(timeout) or not done.ok:
        raise L3StoreError(f"add_kind {kind.label}: the writer did not take the new pool over in {timeout} s")
    return loaded


def close(s, timeout: float) -> None:
    """Flush, stop the spills waiting for room, the writer and the readers, then the files."""
    if s.closed:
        return
    s.flush(timeout)
    with s.staged.cond:
        s.closed = True
        s.staged.cond.notify_all()  # a spill waiting for room gives up now
    s.writer.stop(timeout)
    s.reloader.shutdown()
    s.staging.close()
    close_files(s)


def close_files(s) -> None:
    for grp in s.kinds.values():
        for st in grp.parts:
            slab_set.close_kind(st)
    if s.reloader is not None:
        s.reloader.close_readers()
    if s.index is not None:
        s.index.close()
        s.index = None
    if s.owner is not None:  # last: nothing of this rank is open any more
        s.owner.release()
        s.owner = None


def incompatibility(s, config: L3Config, namespace: Namespace, kinds: Mapping[PayloadKind, int]) -> str:
    """'' when an opener asking for (config, namespace, kinds) can share ``s``, else what differs (both sides
    named). Kinds ``s`` has and the opener does not ask for are fine; kinds it lacks are added (``add_kind``)."""
    if config != s.config:
        diff = [f"{f.name} {getattr(s.config, f.name)!r} vs {getattr(config, f.name)!r}"
                for f in dataclasses.fields(L3Config) if f.compare
                and getattr(s.config, f.name) != getattr(config, f.name)]
        return f"another config ({s.config.source} vs {config.source}: {'; '.join(diff)})"
    ns = namespace.digest_for(config.deployment_id)
    if ns != s.ns:
        return f"another namespace (digest {s.ns.hex()} open, {ns.hex()} asked; {s.namespace} vs {namespace})"
    have = page_sizes(s)
    if any(k in have and have[k] != n for k, n in kinds.items()):
        return f"other payload kinds (open: {kinds_text(have)}; asked: {kinds_text(kinds)})"
    return ""


def page_sizes(s) -> dict[PayloadKind, int]:
    """Each open kind's page size (one C-level copy: a kind may be added meanwhile)."""
    return {k: st.page_bytes for k, st in list(s.kinds.items())}
