"""owners.py: node placement as SGLang launches ranks, replica sets, and one owner per page (pure)."""

import hashlib
import inspect

import pytest

from sglang_glm_ext.l3.hicache.cp_writers import Topology, TopologyError, WriterPlan, owner_index


def _sglang_launch(nnodes, tp_size, pp_size):
    """(node_rank, pp_rank, tp_rank) for every process, as data_parallel_controller.py launches them."""
    out = []
    for node_rank in range(nnodes):
        pp_size_per_node = max(pp_size // nnodes, 1)
        nnodes_per_pp_rank = max(nnodes // pp_size, 1)
        pp_range = range(pp_size_per_node * (node_rank // nnodes_per_pp_rank),
                         pp_size_per_node * (node_rank // nnodes_per_pp_rank + 1))
        tp_size_per_node = tp_size // nnodes_per_pp_rank
        tp_range = range(tp_size_per_node * (node_rank % nnodes_per_pp_rank),
                         tp_size_per_node * (node_rank % nnodes_per_pp_rank + 1))
        out += [(node_rank, pp, tp) for pp in pp_range for tp in tp_range]
    return out


def test_sglang_still_places_ranks_on_nodes_the_way_owners_assumes():
    from sglang.srt.managers.data_parallel_controller import DataParallelController

    src = inspect.getsource(DataParallelController)
    for line in ("pp_size_per_node = max(get_parallel().pp_size // get_parallel().nnodes, 1)",
                 "nnodes_per_pp_rank = max(get_parallel().nnodes // get_parallel().pp_size, 1)",
                 "nnodes_per_tp_group = nnodes_per_pp_rank",
                 "tp_size_per_node = get_parallel().tp_size // nnodes_per_tp_group"):
        assert line in src, line


@pytest.mark.parametrize("nnodes,tp,pp", [(1, 8, 1), (1, 4, 2), (2, 16, 1), (2, 8, 2), (4, 16, 2), (2, 4, 4)])
def test_node_and_local_rank_match_sglangs_launch(nnodes, tp, pp):
    seen = {}
    for node, pp_rank, tp_rank in _sglang_launch(nnodes, tp, pp):
        t = Topology(tp_rank=tp_rank, tp_size=tp, pp_rank=pp_rank, pp_size=pp, nnodes=nnodes)
        assert t.node == node
        seen.setdefault(node, []).append(t.local_rank)
    for ranks in seen.values():  # the L3 ranks of a node are 0..n-1, each once
        assert sorted(ranks) == list(range(len(ranks))) == list(range(Topology(0, tp, 0, pp, nnodes=nnodes)
                                                                       .ranks_per_node))
    assert len(seen) == nnodes


def test_one_node_keeps_the_old_rank_mapping():
    for pp in range(2):
        for tp in range(4):
            assert Topology(tp_rank=tp, tp_size=4, pp_rank=pp, pp_size=2).local_rank == pp * 4 + tp


def test_replicas_are_the_cp_and_attention_tp_ranks_of_one_dp_group_and_stage():
    assert Topology(tp_rank=5, tp_size=8, attn_cp_size=4).replicas() == tuple(range(8))
    t = Topology(tp_rank=5, tp_size=8, attn_cp_size=2, attn_dp_size=2)  # attn_tp 2: dp group 1 = tp 4..7
    assert t.replicas() == (4, 5, 6, 7) and t.attn_cp_rank == 0
    assert Topology(tp_rank=6, tp_size=8, attn_cp_size=2, attn_dp_size=2).attn_cp_rank == 1
    assert [Topology(tp_rank=r, tp_size=4, attn_cp_size=4).attn_cp_rank for r in range(4)] == [0, 1, 2, 3]


def _keys(n):
    return [hashlib.sha256(str(i).encode()).digest() for i in range(n)]


def test_every_page_has_exactly_one_owner_among_the_nodes_replicas_and_every_rank_agrees():
    keys = _keys(4000)
    plans = [WriterPlan.build(Topology(tp_rank=r, tp_size=4, attn_cp_size=4), "spread") for r in range(4)]
    assert {p.writers for p in plans} == {(0, 1, 2, 3)}
    owned = [p.owned(keys) for p in plans]
    for i, k in enumerate(keys):
        assert sum(o[i] for o in owned) == 1
        assert owned[plans[0].owner_of(k)][i]
    shares = [sum(o) for o in owned]
    assert all(abs(s - 1000) < 150 for s in shares), shares  # SHA-256 keys spread evenly (binomial sd ~27)


def test_one_per_node_mode_gives_every_page_to_the_nodes_first_replica():
    keys = _keys(64)
    plans = [WriterPlan.build(Topology(tp_rank=r, tp_size=4, attn_cp_size=4), "one_per_node") for r in range(4)]
    assert plans[0].writes_everything and plans[0].owned(keys) == [True] * 64
    assert all(p.me == -1 and p.owned(keys) == [False] * 64 for p in plans[1:])


def test_a_cp_group_across_two_nodes_has_writers_on_each_node_and_each_node_owns_every_page_once():
    keys = _keys(500)
    by_node = {}
    for r in range(16):
        t = Topology(tp_rank=r, tp_size=16, attn_cp_size=16, nnodes=2)
        p = WriterPlan.build(t, "spread")
        by_node.setdefault(t.node, []).append(p)
        assert p.writers == (tuple(range(8)) if r < 8 else tuple(range(8, 16)))
        assert t.local_rank == r % 8
    for plans in by_node.values():
        owned = [p.owned(keys) for p in plans]
        assert all(sum(o[i] for o in owned) == 1 for i in range(len(keys)))


def test_owner_index_uses_the_keys_leading_bytes():
    k = (7).to_bytes(8, "little") + bytes(24)
    assert owner_index(k, 4) == 3 and owner_index(k, 7) == 0


@pytest.mark.parametrize("kw", [dict(tp_rank=0, tp_size=6, attn_cp_size=4), dict(tp_rank=4, tp_size=4),
                                dict(tp_rank=0, tp_size=6, nnodes=4), dict(tp_rank=0, tp_size=0)])
def test_impossible_layouts_are_refused(kw):
    with pytest.raises(TopologyError):
        Topology(**kw)


def test_unknown_writer_mode_is_refused():
    with pytest.raises(TopologyError, match="writers.mode"):
        WriterPlan.build(Topology(0, 1), "everyone")


def test_owner_indices_name_each_keys_writer_as_owned_and_owner_of_do():
    keys = [hashlib.sha256(bytes([i])).digest() for i in range(64)]
    spread = WriterPlan("spread", (4, 5, 6, 7), 1)
    idx = spread.owner_indices(keys)
    assert set(idx) == {0, 1, 2, 3}
    assert [i == 1 for i in idx] == spread.owned(keys)
    assert [spread.writers[i] for i in idx] == [spread.owner_of(k) for k in keys]
    assert WriterPlan("one_per_node", (4,), -1).owner_indices(keys) == [0] * 64  # one writer, not this rank
