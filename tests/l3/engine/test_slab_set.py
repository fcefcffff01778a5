"""engine/slab_set.py: a rank's slabs of one payload kind -- the one it writes (created, resized in place, its
sidecar rewritten with every namespace that owned it), the slabs of other slot sizes beside it (retired: opened with
their own geometry, or unusable when their sidecar cannot vouch for them), and how the kind's share of the budget is
settled between them (``settle``: emptied / unusable retired slabs deleted, free slots punched, this slab's capacity
grown into what they leave).

Driven on real slabs in tmp_path, the way L3Store.open drives it (open_kind, then settle(punch=True)).
"""

from __future__ import annotations

import errno
import itertools
import json
import os

import pytest

import l3kit
from l3kit import K
from sglang_glm_ext.l3.disk.format import FORMAT_VERSION
from sglang_glm_ext.l3.disk.slab import DiskSlab
from sglang_glm_ext.l3.disk.slab_dir import NAMESPACES_KEPT, read_slab_meta, slab_path_for, write_slab_meta
from sglang_glm_ext.l3.engine.slab_set import close_kind, open_kind, settle
from sglang_glm_ext.l3.errors import L3StoreError, SlabLockedError

OLD_SB, NEW_SB = 2 * 4096, 3 * 4096  # an older model's slot size and this one's
NS_A, NS_B = b"\xaa" * 16, b"\xbb" * 16


@pytest.fixture
def cfg(tmp_path):
    return l3kit.config(tmp_path, budget=2**20)


@pytest.fixture
def opened():
    """open_kind, with every state it returned closed at teardown (the slabs hold flocks)."""
    states = []

    def _open(config, slot_bytes, num_slots, ns=NS_A, *, page_bytes=None):
        st, prior = open_kind(config, rank=0, disk=0, kind=K, page_bytes=page_bytes or slot_bytes - 300,
                              slot_bytes=slot_bytes, num_slots=num_slots, ns_digest=ns, seq=itertools.count(1))
        states.append(st)
        return st, prior

    yield _open
    for st in states:
        close_kind(st)


def _first(cfg):
    return os.path.join(cfg.slab_dir(0, 0), f"{K.label}.slab")


def _write_marker(path, slot, slot_bytes, byte):
    with open(path, "r+b") as f:
        f.seek(slot * slot_bytes)
        f.write(bytes([byte]) * 4096)


def _read_marker(path, slot, slot_bytes):
    with open(path, "rb") as f:
        f.seek(slot * slot_bytes)
        return f.read(4096)


# ------------------------------------------------------------------------------------------------ open_kind
def test_a_new_slab_is_created_preallocated_with_a_sidecar_naming_its_geometry_and_owner(cfg, opened):
    st, prior = opened(cfg, NEW_SB, 6, page_bytes=12000)
    assert prior is None  # nobody owned it before
    path = _first(cfg)
    assert st.slab.path == path == slab_path_for(cfg, 0, K, NEW_SB, 0)
    assert st.slab.created and os.path.getsize(path) == 6 * NEW_SB
    assert st.slab.held_bytes() >= 6 * NEW_SB  # alone: every slot's blocks reserved at open
    assert read_slab_meta(path) == {
        "format_version": FORMAT_VERSION, "kind": K.label, "slot_bytes": NEW_SB, "num_slots": 6, "page_bytes": 12000,
        "deployment_id": cfg.deployment_id, "rank": 0, "disk": 0, "ns_digest": NS_A.hex(), "namespaces": [NS_A.hex()]}
    assert (st.kind, st.page_bytes, st.slot_bytes, st.num_slots, st.disk) == (K, 12000, NEW_SB, 6, 0)
    assert st.retired == [] and st.namespaces == set()
    assert (st.pool.limit, st.pool.free_count, st.pool.used) == (6, 6, 0)  # every slot usable at once


def test_reopening_hands_back_the_previous_owners_sidecar_and_records_every_namespace(cfg, opened):
    st, _ = opened(cfg, NEW_SB, 4, NS_A)
    close_kind(st)
    before = read_slab_meta(_first(cfg))
    st, prior = opened(cfg, NEW_SB, 4, NS_B)
    assert prior == before  # read before it was rewritten (a load keeps entries only if it vouches for them)
    assert not st.slab.created and st.namespaces == {NS_A}  # entries of NS_A map to this slab too
    assert read_slab_meta(_first(cfg))["namespaces"] == [NS_A.hex(), NS_B.hex()]
    close_kind(st)
    st, _ = opened(cfg, NEW_SB, 4, NS_A)  # the first namespace again: listed once, now the latest
    assert read_slab_meta(_first(cfg))["namespaces"] == [NS_B.hex(), NS_A.hex()]
    assert st.namespaces == {NS_A, NS_B}


def test_the_sidecar_keeps_only_the_latest_namespaces_and_drops_what_is_not_a_digest(cfg, opened):
    st, _ = opened(cfg, NEW_SB, 4)
    close_kind(st)
    meta = read_slab_meta(_first(cfg))
    old = [bytes([i]) * 16 for i in range(NAMESPACES_KEPT)]
    meta["namespaces"] = [h.hex() for h in old] + [5, None]  # a hand-edited or damaged list
    write_slab_meta(_first(cfg), meta)
    opened(cfg, NEW_SB, 4, NS_B)
    names = read_slab_meta(_first(cfg))["namespaces"]
    assert names == [h.hex() for h in old[1:]] + [NS_B.hex()]  # the oldest goes, the new one is the latest
    assert len(names) == NAMESPACES_KEPT


@pytest.mark.parametrize("content", ["", "{\"format_version\": ", "not json"])
def test_a_sidecar_that_cannot_be_read_is_no_sidecar_and_is_rewritten(cfg, opened, content):
    """A damaged or half-written sidecar vouches for nothing (a load then keeps none of the slab's entries): the
    open goes on and writes a sound one."""
    st, _ = opened(cfg, NEW_SB, 4)
    close_kind(st)
    with open(_first(cfg) + ".meta.json", "w") as f:
        f.write(content)
    st, prior = opened(cfg, NEW_SB, 4, NS_B)
    assert prior is None and st.namespaces == set() and not st.slab.created
    meta = read_slab_meta(_first(cfg))
    assert (meta["slot_bytes"], meta["num_slots"], meta["namespaces"]) == (NEW_SB, 4, [NS_B.hex()])


@pytest.mark.parametrize("content", ["[1]", "7", "\"x\""])
def test_a_sidecar_that_is_json_but_no_object_is_no_sidecar_either(cfg, opened, content):
    """A hand edit or a damaged file (`[1]`, `7`, `"x"`) counts as no sidecar, as an unparsable one does; it once
    raised AttributeError out of the open and failed the rank's store."""
    st, _ = opened(cfg, NEW_SB, 4)
    close_kind(st)
    with open(_first(cfg) + ".meta.json", "w") as f:
        f.write(content)
    st, _ = opened(cfg, NEW_SB, 4, NS_B)
    assert st.namespaces == set() and not st.slab.created
    assert read_slab_meta(_first(cfg))["namespaces"] == [NS_B.hex()]


@pytest.mark.parametrize("new_slots", [3, 9])
def test_a_budget_change_at_the_same_slot_size_resizes_the_slab_in_place(cfg, opened, new_slots):
    st, _ = opened(cfg, NEW_SB, 6)
    close_kind(st)
    _write_marker(_first(cfg), 2, NEW_SB, 0x5A)
    st, prior = opened(cfg, NEW_SB, new_slots)
    assert st.slab.path == _first(cfg) and st.slab.resized_from == 6
    assert os.path.getsize(_first(cfg)) == new_slots * NEW_SB
    assert _read_marker(_first(cfg), 2, NEW_SB) == b"\x5a" * 4096  # slot boundaries kept: its blob stays
    assert prior["num_slots"] == 6 and read_slab_meta(_first(cfg))["num_slots"] == new_slots
    assert st.retired == [] and st.pool.limit == new_slots


def test_another_slot_size_gets_its_own_file_and_the_old_slab_is_retired_with_its_own_geometry(cfg, opened):
    old, _ = opened(cfg, OLD_SB, 8, NS_A)
    close_kind(old)
    st, prior = opened(cfg, NEW_SB, 6, NS_B)
    assert prior is None  # the new file's own sidecar: none yet
    assert os.path.basename(st.slab.path) == f"{K.label}.s{NEW_SB}.slab"
    assert read_slab_meta(st.slab.path)["slot_bytes"] == NEW_SB
    r, = st.retired
    assert (r.path, r.slot_bytes, r.num_slots, r.usable, r.namespaces) == (_first(cfg), OLD_SB, 8, True, {NS_A})
    assert r.slab is not None and not r.slab.closed and r.slab.slot_bytes == OLD_SB
    # Beside another slab nothing is usable until settle has weighed what the old one holds: no slot, no block.
    assert st.pool.limit == 0 and st.pool.alloc() is None
    assert st.slab.held_bytes() == 0
    assert read_slab_meta(_first(cfg))["slot_bytes"] == OLD_SB  # the old slab's sidecar is left as it was


@pytest.mark.parametrize("sidecar", ["none", "other_format", "bool_slot_bytes", "zero_slots", "wrong_geometry"])
def test_a_slab_its_sidecar_cannot_vouch_for_is_unusable_and_removed_by_settle(cfg, opened, sidecar):
    other = os.path.join(cfg.slab_dir(0, 0), f"{K.label}.s{OLD_SB}.slab")
    os.makedirs(os.path.dirname(other), exist_ok=True)
    with open(other, "wb") as f:
        f.truncate(4 * OLD_SB)
    meta = {"format_version": FORMAT_VERSION, "kind": K.label, "slot_bytes": OLD_SB, "num_slots": 4,
            "deployment_id": cfg.deployment_id, "rank": 0, "ns_digest": NS_A.hex()}
    meta.update({"none": {}, "other_format": {"format_version": FORMAT_VERSION + 1},
                 "bool_slot_bytes": {"slot_bytes": True}, "zero_slots": {"num_slots": 0},
                 "wrong_geometry": {"num_slots": 5}}[sidecar])  # 5 slots: the file is 4 slots long
    if sidecar != "none":
        with open(other + ".meta.json", "w") as f:
            json.dump(meta, f)
    st, _ = opened(cfg, NEW_SB, 6, NS_B)
    assert st.slab.path == _first(cfg)  # the first name was free
    r, = st.retired
    assert r.path == other and not r.usable and r.slab is None and (r.slot_bytes, r.num_slots) == (0, 0)
    assert r.held_bytes == 0  # it holds nothing of the budget
    assert settle(st, punch=True) == 6
    assert st.retired == [] and not os.path.exists(other) and not os.path.exists(other + ".meta.json")
    assert st.pool.limit == 6


def test_a_slab_whose_sidecar_names_another_deployment_is_refused(cfg, opened, tmp_path):
    st, _ = opened(cfg, NEW_SB, 4)
    close_kind(st)
    meta = read_slab_meta(_first(cfg))
    write_slab_meta(_first(cfg), dict(meta, deployment_id="someone-else"))
    size = os.path.getsize(_first(cfg))
    with pytest.raises(L3StoreError, match="belongs to deployment 'someone-else'"):
        opened(cfg, NEW_SB, 8)  # another budget: it would resize the file
    assert os.path.getsize(_first(cfg)) == size  # refused before anything resized it


def test_a_failed_open_leaves_nothing_it_opened_open(cfg, opened):
    """The retired slab was opened (and flock'ed) before this slab's open failed: it is closed again, so the next
    open (or another process) can take it."""
    old, _ = opened(cfg, OLD_SB, 4, NS_A)
    close_kind(old)
    mine = slab_path_for(cfg, 0, K, NEW_SB, 0)
    holder = DiskSlab.open(mine, slot_bytes=NEW_SB, num_slots=4)  # a live server of this rank holds it
    try:
        with pytest.raises(SlabLockedError):
            opened(cfg, NEW_SB, 4, NS_B)
    finally:
        holder.close()
    DiskSlab.open(_first(cfg), slot_bytes=OLD_SB, num_slots=4, create=False).close()  # not locked: it was closed


@pytest.mark.parametrize("mode,io", [("off", "buffered"), ("on", "o_direct")])
def test_the_configs_direct_io_decides_how_the_slab_is_written(tmp_path, opened, mode, io):
    from sglang_glm_ext.l3.disk.space import o_direct_works

    if io == "o_direct" and o_direct_works(str(tmp_path))[0] is not True:
        pytest.skip("this file system refuses O_DIRECT")
    st, _ = opened(l3kit.config(tmp_path, budget=2**20, direct_io=mode), NEW_SB, 2)
    assert st.slab.io_mode == io


# ------------------------------------------------------------------------------------------------ settle
def _with_old_pages(cfg, opened, live_slots, *, old_slots=8, new_slots=6):
    old, _ = opened(cfg, OLD_SB, old_slots, NS_A)
    close_kind(old)
    for slot in range(old_slots):  # every old slot holds bytes (a blob, or an old one nobody points at)
        _write_marker(_first(cfg), slot, OLD_SB, 0x40 + slot)
    st, _ = opened(cfg, NEW_SB, new_slots, NS_B)
    r, = st.retired
    for i, slot in enumerate(live_slots):  # what the cold start found of the old model's pages
        r.lru.record(bytes([i]) * 32, 100 + i, slot)
    return st, r


def test_the_capacity_is_the_kinds_share_minus_what_the_retired_slab_still_holds(cfg, opened):
    st, r = _with_old_pages(cfg, opened, [0, 2, 5])
    want = (6 * NEW_SB - 3 * OLD_SB) // NEW_SB  # the share, less the three old pages, in this slab's slots
    assert settle(st, punch=True) == want == st.pool.limit
    assert st.retired == [r] and os.path.exists(r.path)
    # The old slab's free slots are given back to the file system; only the live pages' blocks stay.
    assert r.slab.held_bytes() == 3 * OLD_SB
    for slot in range(8):  # the live pages keep their bytes; a punched slot reads as zeros (an empty slot)
        want_bytes = bytes([0x40 + slot]) * 4096 if slot in (0, 2, 5) else bytes(4096)
        assert _read_marker(r.path, slot, OLD_SB) == want_bytes, slot
    # This slab reserves exactly the slots it may use now.
    assert st.slab.held_bytes() == want * NEW_SB
    assert settle(st) == 0  # nothing changed: nothing to grow


def test_the_capacity_grows_as_the_old_pages_are_reclaimed_and_the_emptied_slab_is_deleted(cfg, opened):
    st, r = _with_old_pages(cfg, opened, [1, 3])
    first = settle(st, punch=True)
    assert first == (6 * NEW_SB - 2 * OLD_SB) // NEW_SB
    del r.lru.current[bytes([0]) * 32]  # GC reclaimed one of its pages
    grown = settle(st)
    assert grown == (6 * NEW_SB - 1 * OLD_SB) // NEW_SB - first and os.path.exists(r.path)
    r.lru.current.clear()  # ... and the last one
    before = st.pool.limit
    assert before == first + grown
    assert settle(st) == 6 - before
    assert st.retired == [] and st.pool.limit == 6
    assert not os.path.exists(r.path) and not os.path.exists(r.path + ".meta.json") and r.slab.closed


def test_an_emptied_retired_slab_is_deleted_at_open_and_the_whole_share_is_this_slabs(cfg, opened):
    st, r = _with_old_pages(cfg, opened, [])
    assert settle(st, punch=True) == 6
    assert st.retired == [] and not os.path.exists(r.path) and r.slab.closed
    assert st.slab.held_bytes() >= 6 * NEW_SB


def test_blocks_an_earlier_run_left_past_the_capacity_are_punched_at_open(cfg, opened):
    """This slab was fully preallocated by a run with no other slab beside it; now an old slab holds part of the
    share, so the slots past the capacity that hold no page give their blocks back."""
    st, _ = opened(cfg, NEW_SB, 6, NS_B)
    close_kind(st)
    meta = read_slab_meta(_first(cfg))
    beside = os.path.join(cfg.slab_dir(0, 0), f"{K.label}.s{OLD_SB}.slab")
    with DiskSlab.open(beside, slot_bytes=OLD_SB, num_slots=8):
        pass
    write_slab_meta(beside, dict(meta, slot_bytes=OLD_SB, num_slots=8, ns_digest=NS_A.hex(),
                                 namespaces=[NS_A.hex()]))
    st, _ = opened(cfg, NEW_SB, 6, NS_B)
    assert st.slab.held_bytes() >= 6 * NEW_SB  # what the earlier run reserved
    r, = st.retired
    for i, slot in enumerate(range(6)):
        r.lru.record(bytes([i]) * 32, i, slot)
    want = (6 * NEW_SB - 6 * OLD_SB) // NEW_SB
    assert settle(st, punch=True) == want
    assert st.slab.held_bytes() == want * NEW_SB


def test_a_failed_reserve_at_open_is_a_store_error_and_later_leaves_the_capacity_as_it_is(cfg, opened, monkeypatch):
    st, r = _with_old_pages(cfg, opened, [0])

    def full(slots):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(st.slab, "reserve", full)
    with pytest.raises(L3StoreError, match=r"no space to preallocate \d+ slots.*lower the disk budget"):
        settle(st, punch=True)
    assert st.pool.limit == 0  # nothing handed out that has no blocks
    with pytest.raises(OSError) as exc:
        settle(st)
    assert exc.value.errno == errno.ENOSPC and st.pool.limit == 0


# ------------------------------------------------------------------------------------------------ close_kind
def test_close_kind_closes_the_slab_and_every_retired_one_and_may_be_called_again(cfg, opened):
    st, r = _with_old_pages(cfg, opened, [0])
    close_kind(st)
    assert st.slab.closed and r.slab.closed
    close_kind(st)  # idempotent
    close_kind(None)  # nothing at all: nothing to do


def test_close_kind_without_a_state_closes_what_it_is_given(cfg, opened):
    st, r = _with_old_pages(cfg, opened, [0])
    close_kind(None, st.slab, st.retired)
    assert st.slab.closed and r.slab.closed
