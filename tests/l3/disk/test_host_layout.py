"""Host page layouts: gather/scatter are byte-exact for page-first and (split) layer-first pools, and bounded."""

import ctypes

import numpy as np
import pytest

from sglang_glm_ext.l3.disk import format as F
from sglang_glm_ext.l3.disk.aligned import AlignedBuffer
from sglang_glm_ext.l3.disk.host_layout import PageLayout, Slice, _region

RNG = np.random.default_rng(5)


def rand(n):
    return RNG.integers(0, 256, n, dtype=np.uint8)


def test_glm5_mla_page_bytes():
    pool = np.zeros(78 * 2 * 64 * 656, dtype=np.uint8)
    layout = PageLayout.for_mla_layer_first(pool, n_layers=78, page_size=64, kv_cache_dim=656, itemsize=1,
                                            num_pages=2)
    assert layout.page_bytes == 3_274_752 and len(layout.slices) == 78
    page_first = PageLayout.for_mla_page_first(pool, n_layers=78, page_size=64, kv_cache_dim=656, itemsize=1,
                                               num_pages=2)
    assert page_first.page_bytes == 3_274_752 and len(page_first.slices) == 1


def test_page_first_is_one_direct_copy():
    pages, pb = 5, 3000
    host = rand(pages * pb)
    layout = PageLayout.page_first(host, page_bytes=pb, num_pages=pages)
    assert len(layout.slices) == 1  # no per-layer pass
    dst = np.zeros(pb + 10, dtype=np.uint8)
    layout.gather_into(3, dst, 10)
    assert np.array_equal(dst[10:], host[3 * pb:4 * pb]) and not dst[:10].any()


def test_layer_first_gather_matches_numpy_reference():
    n_layers, pages, sb = 6, 4, 100
    host = rand(n_layers * pages * sb)
    layout = PageLayout.layer_first(host, n_layers=n_layers, slice_bytes=sb, num_pages=pages)
    dst = np.zeros(layout.page_bytes, dtype=np.uint8)
    layout.gather_into(2, dst)
    expected = host.reshape(n_layers, pages, sb)[:, 2, :].ravel()  # layer-major payload order
    assert np.array_equal(dst, expected)


def test_layer_first_split_over_buffers_roundtrip_byte_exact():
    """Host cache split over 3 buffers of uneven layer counts: gather then scatter into a fresh pool is exact."""
    n_layers, pages, sb = 7, 5, 656 * 3
    counts = [3, 2, 2]
    bufs = [rand(c * pages * sb) for c in counts]
    layout = PageLayout.layer_first(bufs, n_layers=n_layers, slice_bytes=sb, num_pages=pages)
    owners = [bufs[0]] * 3 + [bufs[1]] * 2 + [bufs[2]] * 2
    assert all(s.region.owner is b for s, b in zip(layout.slices, owners))
    blob = np.zeros(F.HEADER_SIZE + layout.page_bytes, dtype=np.uint8)
    ref = np.concatenate([b.reshape(c, pages, sb)[:, 4, :].ravel() for b, c in zip(bufs, counts)])
    layout.gather_into(4, blob, F.HEADER_SIZE)
    assert np.array_equal(blob[F.HEADER_SIZE:], ref)

    fresh = [np.zeros_like(b) for b in bufs]
    target = PageLayout.layer_first(fresh, n_layers=n_layers, slice_bytes=sb, num_pages=pages,
                                    layers_per_buffer=counts)
    target.scatter_from(4, blob, F.HEADER_SIZE)
    for b, f, c in zip(bufs, fresh, counts):
        got, want = f.reshape(c, pages, sb), b.reshape(c, pages, sb)
        assert np.array_equal(got[:, 4, :], want[:, 4, :])
        assert not np.delete(got, 4, axis=1).any()  # neighbouring pages untouched


def test_gather_straight_into_the_slot_image_then_verify():
    n_layers, pages, sb = 4, 3, 5000
    host = rand(n_layers * pages * sb)
    layout = PageLayout.layer_first(host, n_layers=n_layers, slice_bytes=sb, num_pages=pages)
    with AlignedBuffer(F.slot_bytes_for(layout.page_bytes)) as slot:
        layout.gather_into(1, slot, F.PAYLOAD_OFFSET)
        ns = F.Namespace("m", "fp8", "layer_first", 64, 0, n_layers, "tp0of1").digest()
        F.seal_blob(slot, kind="target_kv", content_hash="ee" * 32, ns_digest=ns, payload_len=layout.page_bytes)
        payload = F.verify_blob(slot, kind="target_kv", content_hash="ee" * 32, ns_digest=ns)
        out = np.zeros_like(host)
        PageLayout.layer_first(out, n_layers=n_layers, slice_bytes=sb, num_pages=pages).scatter_from(1, payload)
        payload.release()
    assert np.array_equal(out.reshape(n_layers, pages, sb)[:, 1], host.reshape(n_layers, pages, sb)[:, 1])


def test_raw_address_pairs_like_tensor_data_ptr():
    n_layers, pages, sb = 3, 2, 64
    host = rand(n_layers * pages * sb)
    layout = PageLayout.layer_first((host.ctypes.data, host.nbytes), n_layers=n_layers, slice_bytes=sb,
                                    num_pages=pages)
    dst = bytearray(layout.page_bytes)
    layout.gather_into(1, dst)
    assert bytes(dst) == host.reshape(n_layers, pages, sb)[:, 1].tobytes()


def test_dsa_indexer_layouts():
    n_layers, pages, stride = 5, 3, 64 * 132
    layer_bufs = [rand(pages * stride) for _ in range(n_layers)]  # one buffer per layer
    lf = PageLayout.for_dsa_indexer(layer_bufs, n_layers=n_layers, page_stride=stride, num_pages=pages)
    dst = bytearray(lf.page_bytes)
    lf.gather_into(2, dst)
    assert bytes(dst) == b"".join(b[2 * stride:3 * stride].tobytes() for b in layer_bufs)

    pf_host = rand(pages * n_layers * stride)
    pf = PageLayout.for_dsa_indexer(pf_host, n_layers=n_layers, page_stride=stride, num_pages=pages, page_first=True)
    pf.gather_into(0, dst)
    assert bytes(dst) == pf_host[: n_layers * stride].tobytes()


def test_out_of_range_page_is_loud_and_never_touches_memory():
    host = rand(4 * 100)
    layout = PageLayout.page_first(host, page_bytes=100, num_pages=4)
    dst = bytearray(100)
    for bad in (-1, 4, 10**6):
        with pytest.raises(IndexError):
            layout.gather_into(bad, dst)
        with pytest.raises(IndexError):
            layout.scatter_from(bad, dst)


def test_layout_larger_than_buffer_is_rejected_at_construction():
    host = rand(399)
    with pytest.raises(ValueError, match="ends at byte 400"):
        PageLayout.page_first(host, page_bytes=100, num_pages=4)
    with pytest.raises(ValueError):
        PageLayout.layer_first([rand(200), rand(150)], n_layers=2, slice_bytes=50, num_pages=4)
    with pytest.raises(ValueError, match="does not cover"):
        PageLayout.layer_first([rand(200), rand(200)], n_layers=3, slice_bytes=50, num_pages=4,
                               layers_per_buffer=[1, 1])


def test_short_destination_or_source_is_rejected():
    host = rand(400)
    layout = PageLayout.page_first(host, page_bytes=100, num_pages=4)
    with pytest.raises(ValueError, match="cannot hold"):
        layout.gather_into(0, bytearray(150), 60)
    with pytest.raises(ValueError, match="cannot hold"):
        layout.scatter_from(0, bytes(99))


def test_read_only_buffers_refuse_writes():
    ro = np.frombuffer(bytes(400), dtype=np.uint8)
    layout = PageLayout.page_first(ro, page_bytes=100, num_pages=4)
    layout.gather_into(0, bytearray(100))  # reading a read-only pool is fine
    with pytest.raises(ValueError, match="read-only"):
        layout.scatter_from(0, bytes(100))
    rw = PageLayout.page_first(rand(400), page_bytes=100, num_pages=4)
    with pytest.raises(ValueError, match="read-only"):
        rw.gather_into(0, bytes(100))


def _spans_by_hand(layout, p):
    return [ctypes.string_at(s.region.address + s.offset + p * s.stride, s.length) for s in layout.slices]


@pytest.mark.parametrize("shape", ["page_first", "layer_first", "split", "mixed"])
def test_page_spans_name_each_pages_own_bytes(shape):
    """What a reload reads into and hashes: page p's pieces are its slices' bytes, in slice order, for the layouts
    whose slices share one stride and length (one slice object for all) and for one whose slices do not."""
    pages = 5
    bufs = [AlignedBuffer(1 << 16), AlignedBuffer(1 << 16)]
    for b in bufs:
        b.view[:] = rand(len(b.view)).tobytes()
    if shape == "page_first":
        layout = PageLayout.page_first(bufs[0], page_bytes=3000, num_pages=pages)
    elif shape == "layer_first":
        layout = PageLayout.layer_first(bufs[0], n_layers=4, slice_bytes=1000, num_pages=pages)
    elif shape == "split":
        layout = PageLayout.layer_first(bufs, n_layers=4, slice_bytes=1000, num_pages=pages, layers_per_buffer=[1, 3])
    else:  # slices of different lengths and strides (no factory makes one; the general path must still be exact)
        layout = PageLayout([Slice(_region(bufs[0]), 100, 700, 600), Slice(_region(bufs[1]), 4096, 2048, 1500)],
                            pages)
    for p in range(pages):
        spans = layout.page_spans(p)
        assert (spans.same is None) == (shape == "mixed")
        pieces = spans.pieces()
        assert [bytes(v) for v in pieces] == _spans_by_hand(layout, p)
        assert [len(v) for v in pieces] == list(spans.lengths)
        assert all(not v.readonly for v in pieces)
        if spans.same is not None:
            assert list(spans.starts) == [spans.same.start] * len(pieces)
        # The grid (one strided copy fills the page) only where every slice is in one buffer at one spacing; and
        # then it names exactly the same bytes as the pieces.
        assert (spans.grid is not None) == (shape == "layer_first")
        if spans.grid is not None:
            view, gap = spans.grid
            n = spans.lengths[0]
            assert [bytes(view[spans.same.start + i * gap:][:n]) for i in range(len(pieces))] == _spans_by_hand(
                layout, p)


def test_no_grid_for_slices_that_are_not_evenly_spaced_in_one_buffer():
    """Equal slices at two spacings, or overlapping ones, get no grid: a strided copy would write the wrong bytes."""
    buf = AlignedBuffer(1 << 16)
    r = _region(buf)
    uneven = PageLayout([Slice(r, 0, 100, 100), Slice(r, 5000, 100, 100), Slice(r, 9000, 100, 100)], 10)
    overlapping = PageLayout([Slice(r, 0, 100, 100), Slice(r, 50, 100, 100)], 10)
    for layout in (uneven, overlapping):
        spans = layout.page_spans(3)
        assert spans.same is not None and spans.grid is None
