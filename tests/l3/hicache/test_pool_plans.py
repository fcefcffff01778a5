"""Layout planning on plain numpy buffers: each served layout maps pages to the right bytes; bad indices and
unserved layouts are refused; the payload never reaches outside the host buffer."""

import numpy as np
import pytest

from sglang_glm_ext.l3.disk.aligned import buffer_address
from sglang_glm_ext.l3.hicache.pool_plans import DECISIONS, Buffer, LayoutRefused, PoolGeometry, plan_pool

PS, PAGES, L, ROW = 4, 6, 3, 8


_RNG = np.random.default_rng(7)


def _buf(nbytes):
    a = _RNG.integers(0, 256, nbytes).astype(np.uint8)  # every buffer distinct: K and V never coincide
    return a, Buffer(buffer_address(a), a.nbytes)


def _payload(plan, page):
    out = np.zeros(plan.page_bytes, dtype=np.uint8)
    plan.layout.gather_into(page, out)
    return out


def test_mla_layer_first_payload_is_layer_major():
    a, b = _buf(L * PAGES * PS * ROW)
    plan = plan_pool(PoolGeometry("kv", "mla", "layer_first", PS, PAGES, L, ROW, (b,)))
    cube = a.reshape(L, PAGES * PS, ROW)
    want = cube[:, 2 * PS:3 * PS, :].reshape(-1)  # SGLang's get_data_page order: kv_buffer[:, i:i+ps]
    assert np.array_equal(_payload(plan, 2), want)
    assert len(plan.layout.slices) == L


@pytest.mark.parametrize("layout", ["page_first", "page_first_direct", "page_unified"])
def test_mla_page_major_layouts_are_one_block(layout):
    a, b = _buf(PAGES * PS * L * ROW)
    plan = plan_pool(PoolGeometry("kv", "mla", layout, PS, PAGES, L, ROW, (b,)))
    blk = PS * L * ROW
    assert np.array_equal(_payload(plan, 5), a[5 * blk:6 * blk]) and len(plan.layout.slices) == 1


def test_dsa_indexer_layer_first_and_page_first():
    stride = 12
    a, b = _buf(L * PAGES * stride)
    lf = plan_pool(PoolGeometry("indexer", "dsa_indexer", "layer_first", PS, PAGES, L, stride, (b,)))
    assert np.array_equal(_payload(lf, 1), a.reshape(L, PAGES, stride)[:, 1, :].reshape(-1))
    pf = plan_pool(PoolGeometry("indexer", "dsa_indexer", "page_first", PS, PAGES, L, stride, (b,)))
    assert np.array_equal(_payload(pf, 1), a.reshape(PAGES, L * stride)[1])


def test_mha_layer_first_payload_is_k_layers_then_v_layers():
    k, bk = _buf(L * PAGES * PS * ROW)
    v, bv = _buf(L * PAGES * PS * ROW)
    plan = plan_pool(PoolGeometry("kv", "mha", "layer_first", PS, PAGES, L, ROW, (bk, bv)))
    kk, vv = k.reshape(L, PAGES * PS, ROW), v.reshape(L, PAGES * PS, ROW)
    want = np.concatenate([kk[:, 3 * PS:4 * PS].reshape(-1), vv[:, 3 * PS:4 * PS].reshape(-1)])
    assert np.array_equal(_payload(plan, 3), want)


@pytest.mark.parametrize("layout", ["page_first", "page_first_direct", "page_head"])
def test_mha_page_major_is_one_k_and_one_v_block(layout):
    k, bk = _buf(PAGES * PS * L * ROW)
    v, bv = _buf(PAGES * PS * L * ROW)
    plan = plan_pool(PoolGeometry("kv", "mha", layout, PS, PAGES, L, ROW, (bk, bv)))
    blk = PS * L * ROW
    assert np.array_equal(_payload(plan, 2), np.concatenate([k[2 * blk:3 * blk], v[2 * blk:3 * blk]]))


def test_spans_name_the_slices_of_a_page():
    a, b = _buf(L * PAGES * PS * ROW)
    plan = plan_pool(PoolGeometry("kv", "mla", "layer_first", PS, PAGES, L, ROW, (b,)))
    spans = plan.spans(1)
    assert spans == [(b.address + layer * PAGES * PS * ROW + PS * ROW, PS * ROW) for layer in range(L)]


@pytest.mark.parametrize("indices,n", [
    (np.arange(2 * PS), 2),
    (np.concatenate([np.arange(5 * PS, 6 * PS), np.arange(0, PS)]), 2),
])
def test_pages_of_valid_indices(indices, n):
    _, b = _buf(PAGES * PS * L * ROW)
    plan = plan_pool(PoolGeometry("kv", "mla", "page_first", PS, PAGES, L, ROW, (b,)))
    assert plan.pages(indices.astype(np.int64), n) == [int(i) // PS for i in indices[::PS]]


@pytest.mark.parametrize("indices,n,why", [
    (np.arange(2 * PS), 3, "count"),
    (np.arange(1, 2 * PS + 1), 2, "unaligned"),
    (np.array([0, 1, 3, 2]), 1, "not contiguous in the page"),
    (np.arange(PAGES * PS, (PAGES + 1) * PS), 1, "past the pool"),
    (np.arange(-PS, 0), 1, "negative"),
    (np.zeros((2, PS), dtype=np.int64), 1, "not 1-D"),
])
def test_bad_indices_are_refused_not_mapped(indices, n, why):
    _, b = _buf(PAGES * PS * L * ROW)
    plan = plan_pool(PoolGeometry("kv", "mla", "page_first", PS, PAGES, L, ROW, (b,)))
    assert plan.pages(np.asarray(indices, dtype=np.int64), n) is None, why


def test_buffer_smaller_than_the_geometry_is_refused():
    _, b = _buf(PAGES * PS * L * ROW - 1)
    with pytest.raises(LayoutRefused, match="geometry says"):
        plan_pool(PoolGeometry("kv", "mla", "page_first", PS, PAGES, L, ROW, (b,)))


@pytest.mark.parametrize("family,layout", [("mla", "page_first_kv_split"), ("mla", "page_head"),
                                           ("dsa_indexer", "page_unified"), ("mamba", "page_first")])
def test_unserved_layouts_are_refused_with_a_reason(family, layout):
    _, b = _buf(64)
    with pytest.raises(LayoutRefused, match="not served"):
        plan_pool(PoolGeometry("kv", family, layout, PS, 1, 1, 1, (b,)))


def test_asymmetric_mha_is_refused():
    _, b = _buf(PAGES * PS * L * ROW)
    with pytest.raises(LayoutRefused, match="asymmetric"):
        plan_pool(PoolGeometry("kv", "mha", "page_first", PS, PAGES, L, ROW, (b, b), v_row_bytes=ROW * 2))


def test_every_written_decision_has_a_reason():
    assert all(verdict in ("served", "refused") and why for verdict, why in DECISIONS.values())
    assert DECISIONS[("mla", "page_first_kv_split")][0] == "refused"
