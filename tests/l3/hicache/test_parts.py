"""hicache/parts.py: what one CP rank holds of a page when ranks hold different bytes -- ``LayerPart`` (DSA cache
layer split: its own layers, padded to ceil(L / N) host layers), ``uncovered`` (every part-holder in one of SGLang's
storage MIN groups) and ``kv_stripe`` (KV sharding: logical host page h is rank h % N's local page h // N).

Expected values come from a second computation: the host layer count from an explicit contiguous split, the stripe
from SGLang's per-slot placement arithmetic (owner ``(loc % (N*ps)) // ps``, local row ``(loc // (N*ps))*ps +
loc % ps``) applied slot by slot.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import numpy as np
import pytest

import l3kit
from sglang_glm_ext.l3.hicache.parts import LayerPart, kv_stripe, uncovered


# ------------------------------------------------------------------------------------------------ LayerPart
def _contiguous_split(total: int, n: int) -> list[range]:
    """An even contiguous split of ``total`` layers over ``n`` ranks (parts differ by at most one layer)."""
    out, start = [], 0
    for r in range(n):
        size = total // n + (1 if r < total % n else 0)
        out.append(range(start, start + size))
        start += size
    return out


@pytest.mark.parametrize("total,n", [(5, 2), (5, 3), (78, 4), (78, 5), (7, 7), (4, 2), (79, 8)])
def test_every_rank_keeps_as_many_host_layers_as_the_largest_part(total, n):
    parts = _contiguous_split(total, n)
    want = max(len(p) for p in parts)
    for r, layers in enumerate(parts):
        if not len(layers):
            continue
        part = LayerPart(r, n, layers.start, layers.stop, total, tuple(range(n)))
        assert part.host_layers == want
        assert part.host_layers >= part.layer_end - part.layer_start  # a smaller part pads, never truncates


def test_a_part_names_global_layer_ids_and_its_group():
    part = LayerPart(1, 2, 40 + 3, 40 + 5, 5, (6, 7))  # a pipeline stage starting at layer 40; rank 1 of 5 layers
    assert (part.layer_start, part.layer_end, part.group_ranks) == (43, 45, (6, 7))
    assert part.host_layers == 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        part.rank = 0  # it goes into the namespace: never changed after the attach decided it


@pytest.mark.parametrize("kw,match", [
    (dict(rank=0, size=1), "rank 0 of 1"),  # a split over one rank is no split
    (dict(rank=0, size=0, group_ranks=()), "rank 0 of 0"),
    (dict(rank=2, size=2), "rank 2 of 2"),
    (dict(rank=-1, size=2), "rank -1 of 2"),
    (dict(layer_start=3, layer_end=3), r"owns no layer: \[3, 3\)"),
    (dict(layer_start=4, layer_end=3), r"owns no layer: \[4, 3\)"),
    (dict(group_ranks=(0, 1, 2)), "group has 3 ranks, size 2"),
])
def test_a_part_that_cannot_exist_is_refused(kw, match):
    args = dict(rank=0, size=2, layer_start=0, layer_end=3, device_layers=5, group_ranks=(0, 1))
    args.update(kw)
    if "size" in kw and "group_ranks" not in kw:
        args["group_ranks"] = tuple(range(max(kw["size"], 0)))
    with pytest.raises(ValueError, match=match):
        LayerPart(**args)


# ------------------------------------------------------------------------------------------------ uncovered
@pytest.mark.parametrize("ranks", [[], [3], [3, 3]])
def test_one_holder_needs_no_group(ranks):
    assert uncovered(ranks, []) == ""


@pytest.mark.parametrize("groups", [
    [[0, 1]],
    [[1, 0]],  # any order
    [[4, 5], [0, 1, 2, 3]],  # a wider group (CP x attention TP) holds the part group
    [np.array([0, 1], dtype=np.int64)],  # numpy ranks as SGLang's group lists may carry
])
def test_one_group_holding_every_part_holder_covers_them(groups):
    assert uncovered([0, 1], groups) == ""
    assert uncovered(np.array([1, 0]), groups) == ""


def test_groups_that_only_together_hold_the_parts_do_not_cover_them():
    """Each MIN reduces over one group: two groups that each hold one part could each agree on a page whose other
    part is missing."""
    why = uncovered([2, 0], [[0], [2]])
    assert why.startswith("the ranks holding the parts of a page [0, 2] are not all in one of")
    assert "[[0], [2]]" in why


def test_no_group_at_all_covers_two_holders():
    assert "[0, 1]" in uncovered([0, 1], [])


# ------------------------------------------------------------------------------------------------ kv_stripe
def _slot_placement(host: np.ndarray, n: int, ps: int, rank: int, page_count: int):
    """SGLang's placement per logical slot, folded into pages: (mine, local page) of each page, or None where the
    slots of one page disagree (then they were not one page)."""
    owner = (host % (n * ps)) // ps
    local_row = (host // (n * ps)) * ps + host % ps
    mine, local = [], []
    for p in range(page_count):
        o = owner[p * ps:(p + 1) * ps]
        rows = local_row[p * ps:(p + 1) * ps]
        if len(set(o.tolist())) != 1 or not (rows == rows[0] + np.arange(ps)).all() or rows[0] % ps:
            return None
        mine.append(int(o[0]) == rank)
        local.append(int(rows[0]) // ps)
    return mine, local


def _pages(page_ids, ps):
    return np.concatenate([np.arange(h * ps, (h + 1) * ps) for h in page_ids]).astype(np.int64)


@pytest.mark.parametrize("n,ps", [(2, 4), (3, 4), (4, 1), (1, 8), (5, 64)])
def test_kv_stripe_is_sglangs_per_slot_placement(n, ps):
    rng = np.random.default_rng(n * 100 + ps)
    for _ in range(5):
        page_ids = rng.permutation(40)[:int(rng.integers(1, 12))]  # any order, not necessarily consecutive pages
        host = _pages(page_ids, ps)
        for rank in range(n):
            got = kv_stripe(host, len(page_ids), page_size=ps, shard_size=n, shard_rank=rank, local_pages=64)
            assert got == _slot_placement(host, n, ps, rank, len(page_ids))
        # every page is held by exactly one rank
        held = [kv_stripe(host, len(page_ids), page_size=ps, shard_size=n, shard_rank=r, local_pages=64)[0]
                for r in range(n)]
        assert [sum(h[i] for h in held) for i in range(len(page_ids))] == [1] * len(page_ids)


def test_one_shard_holds_every_page_at_its_own_number():
    host = _pages([3, 0, 7], 4)
    assert kv_stripe(host, 3, page_size=4, shard_size=1, shard_rank=0, local_pages=8) == ([True] * 3, [3, 0, 7])


def test_local_pages_bound_is_exclusive():
    host = _pages([2 * 5 + 1], 4)  # logical page 11 of 2 shards: rank 1's local page 5
    assert kv_stripe(host, 1, page_size=4, shard_size=2, shard_rank=1, local_pages=6) == ([True], [5])
    assert kv_stripe(host, 1, page_size=4, shard_size=2, shard_rank=1, local_pages=5) is None
    # ... for the rank that does not hold the page too: its local page number is still out of the pool
    assert kv_stripe(host, 1, page_size=4, shard_size=2, shard_rank=0, local_pages=5) is None


PS = 4


@pytest.mark.parametrize("host,n,kw", [
    (_pages([0], PS), 0, {}),  # no page
    (_pages([0], PS), -1, {}),
    (_pages([0, 1], PS), 1, {}),  # more indices than n pages
    (_pages([0], PS), 2, {}),  # fewer
    (np.arange(1, PS + 1, dtype=np.int64), 1, {}),  # a page that does not start on a page boundary
    (np.array([0, 1, 3, 2], dtype=np.int64), 1, {}),  # not one contiguous run
    (np.array([4, 5, 6, 8], dtype=np.int64), 1, {}),  # runs into the next page
    (np.arange(-PS, 0, dtype=np.int64), 1, {}),  # negative
    (_pages([0, 1], PS).reshape(2, PS), 2, {}),  # not 1-D
    (_pages([0], PS), 1, {"shard_size": 0, "shard_rank": 0}),
    (_pages([0], PS), 1, {"shard_rank": 2}),  # rank outside the group
    (_pages([0], PS), 1, {"shard_rank": -1}),
])
def test_indices_that_are_not_whole_pages_are_refused_never_guessed(host, n, kw):
    args = dict(page_size=PS, shard_size=2, shard_rank=0, local_pages=64)
    args.update(kw)
    assert kv_stripe(host, n, **args) is None


def test_importing_parts_pulls_in_no_numpy_torch_or_sglang():
    """The launch hooks read this module's refusals before anything heavy is imported: numpy is imported inside
    kv_stripe, and no SGLang or torch at all."""
    code = ("import sys; import sglang_glm_ext.l3.hicache.parts as p; "
            "print(sorted(m for m in ('numpy', 'torch', 'sglang') if m in sys.modules)); "
            "print(len(p.KV_SHARDING_REFUSED) > 0 and len(p.DCP_REFUSED) > 0)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSTARTUP"}
    env["PYTHONPATH"] = str(l3kit.REPO)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=str(l3kit.REPO),
                         timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split("\n")[:2] == ["[]", "True"], res.stdout
