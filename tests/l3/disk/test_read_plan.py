"""Read plans: every payload byte reaches its span exactly once, nothing else leaves the bounce buffer, and every
transfer obeys the alignment the file system reported (memory address, file offset, segment length)."""

import numpy as np
import pytest

from sglang_glm_ext.l3.disk.dio_align import DioAlignment
from sglang_glm_ext.l3.disk.format import HEADER_SIZE, PAYLOAD_OFFSET, slot_bytes_for
from sglang_glm_ext.l3.disk.read_plan import period, plan_read

GLM5_CHUNK, GLM5_LAYERS = 64 * 656, 78  # 41,984 B per layer and page (SGLang's fp8 DSA MLA row: 656 B)
GLM5_PAGE = GLM5_CHUNK * GLM5_LAYERS


def run_plan(plan, slot, addrs, lengths, mem_size, align):
    """Execute a plan against simulated memory; check the alignment rules on the way. Returns (memory, bounce)."""
    mem = np.full(mem_size, 0xA5, np.uint8)
    bounce = np.full(plan.bounce_bytes, 0x5A, np.uint8)
    pos = 0
    for i, off, at, n in plan.segments:
        assert n > 0 and n % align.offset == 0 and pos % align.offset == 0
        if i >= 0:
            assert (addrs[i] + off) % align.mem == 0 and off + n <= lengths[i]
            mem[addrs[i] + off:addrs[i] + off + n] = slot[pos:pos + n]
        else:
            assert at % align.mem == 0 and at + n <= plan.bounce_bytes
            bounce[at:at + n] = slot[pos:pos + n]
        pos += n
    assert pos == len(slot)  # one pass over the whole slot
    for i, off, at, n in plan.copies:
        assert off + n <= lengths[i]
        mem[addrs[i] + off:addrs[i] + off + n] = bounce[at:at + n]
    return mem, bounce


def check(lengths, addrs, slot_bytes, align, vectored, mem_size, seed=0):
    rng = np.random.default_rng(seed)
    slot = rng.integers(0, 256, slot_bytes, dtype=np.uint8)
    mods = tuple(a % align.mem for a in addrs)
    plan = plan_read(tuple(lengths), mods, slot_bytes, align, vectored)
    mem, bounce = run_plan(plan, slot, addrs, lengths, mem_size, align)
    at, want = 0, np.full(mem_size, 0xA5, np.uint8)
    for a, n in zip(addrs, lengths):
        want[a:a + n] = slot[at:at + n]
        at += n
    assert np.array_equal(mem, want)  # each span exact; every other byte (neighbours, gaps) untouched
    assert bytes(bounce[plan.trailer_at:plan.trailer_at + HEADER_SIZE]) == slot[-HEADER_SIZE:].tobytes()
    # The reader's fast path (plan.tail): the spans, each whole and direct, are the first segments in span order,
    # then bounce segments only. Offered exactly when that holds, and then the same as the segments.
    whole = [(i, 0, -1, n) for i, n in enumerate(lengths)]
    lead = list(plan.segments[:len(lengths)]) == whole and all(i < 0 for i, *_ in plan.segments[len(lengths):])
    assert (plan.tail is not None) == lead
    if lead:
        assert plan.segments == tuple(whole) + plan.tail and plan.span_segments == tuple(range(len(lengths)))
    # plan.packed: every span copied whole from the bounce buffer, in order, back to back (one strided copy may do
    # them all); always so for a single transfer.
    starts = [c[2] for c in plan.copies]
    packed = [(c[0], c[1], c[3]) for c in plan.copies] == [(i, 0, n) for i, n in enumerate(lengths)] and \
        all(b == a + n for a, b, n in zip(starts, starts[1:], lengths))
    assert (plan.packed is not None) == packed and (packed or vectored)
    if packed:
        assert plan.packed == starts[0]
        assert np.array_equal(bounce[plan.packed:plan.packed + sum(lengths)],
                              slot[PAYLOAD_OFFSET:PAYLOAD_OFFSET + sum(lengths)])
    return plan


def test_a_glm5_layer_first_page_reads_straight_into_its_78_chunks():
    slot = slot_bytes_for(GLM5_PAGE)
    layer_bytes = 4 * GLM5_CHUNK  # a 4-page host pool: layer l's chunk of page 1 at l * layer_bytes + GLM5_CHUNK
    addrs = [l * layer_bytes + GLM5_CHUNK for l in range(GLM5_LAYERS)]
    plan = check([GLM5_CHUNK] * GLM5_LAYERS, addrs, slot, DioAlignment(512, 512, "t"), True,
                 GLM5_LAYERS * layer_bytes)
    assert plan.direct_bytes == GLM5_PAGE and plan.copies == ()  # no payload byte through the bounce buffer
    assert plan.bounce_bytes == slot - GLM5_PAGE == 2048  # the pad and the header only
    assert len(plan.segments) == GLM5_LAYERS + 1


def test_a_glm5_page_first_page_is_one_direct_segment_and_a_tail_block():
    slot = slot_bytes_for(GLM5_PAGE)
    for page in range(3):  # consecutive host pages alternate between 4 KiB and 2 KiB alignment
        plan = check([GLM5_PAGE], [page * GLM5_PAGE], slot, DioAlignment(512, 512, "t"), True, 3 * GLM5_PAGE)
        assert plan.direct_bytes == GLM5_PAGE and len(plan.segments) == 2
    # Under 4 KiB alignment every other page starts 2 KiB off: whole through the bounce buffer, still exact
    plan = check([GLM5_PAGE], [GLM5_PAGE], slot, DioAlignment(4096, 4096, "t"), True, 2 * GLM5_PAGE)
    assert plan.direct_bytes == 0
    plan = check([GLM5_PAGE], [0], slot, DioAlignment(4096, 4096, "t"), True, 2 * GLM5_PAGE)
    assert plan.direct_bytes == GLM5_PAGE - 2048  # the last half block shares a 4 KiB block with the header


def test_single_transfer_plan_bounces_everything():
    slot = slot_bytes_for(GLM5_PAGE)
    addrs = [l * GLM5_CHUNK for l in range(GLM5_LAYERS)]
    plan = check([GLM5_CHUNK] * GLM5_LAYERS, addrs, slot, DioAlignment(512, 512, "t"), False, GLM5_PAGE)
    assert plan.direct_bytes == 0 and len(plan.segments) == 1 and plan.bounce_bytes == slot


@pytest.mark.parametrize("align", [DioAlignment(512, 512, "t"), DioAlignment(4096, 4096, "t"),
                                   DioAlignment(4, 512, "nvme"), DioAlignment(4096, 512, "t"),
                                   DioAlignment(1, 1, "buffered")])
def test_random_spans_and_addresses_are_exact_and_aligned(align):
    """Chunks that are not block multiples (a DSA indexer's 8,448 B), addresses at any offset, gaps between the
    spans: every plan writes exactly its spans' bytes and obeys the alignment."""
    rng = np.random.default_rng(align.mem * 7 + align.offset)
    for trial in range(150):
        n = int(rng.integers(1, 9))
        lengths = [int(x) for x in rng.integers(1, 9000, n)]
        slot = slot_bytes_for(sum(lengths)) + 4096 * int(rng.integers(0, 2))
        addrs, at = [], int(rng.integers(0, 1024))
        for ln in lengths:
            at += int(rng.choice([0, 1, 7, 512, 4096 - at % 4096]))
            addrs.append(at)
            at += ln
        if rng.random() < 0.3:
            rng.shuffle(addrs)  # spans need not be in address order (a split host pool)
            addrs = [a + i * 200_000 for i, a in enumerate(addrs)]  # apart by more than all spans: no overlap
        check(lengths, addrs, slot, align, bool(rng.random() < 0.8), max(addrs) + 20000, seed=trial)


def test_a_payload_that_does_not_fit_the_slot_is_refused():
    with pytest.raises(ValueError):
        plan_read((4000,), (0,), 4096, DioAlignment(512, 512, "t"), True)


def test_period_of_page_addresses_modulo_the_alignment():
    assert period([GLM5_CHUNK] * 78, 512) == 1 and period([GLM5_PAGE], 512) == 1
    assert period([GLM5_PAGE], 4096) == 2  # pages alternate between 4 KiB- and 2 KiB-aligned
    assert period([64 * 132], 512) == 2  # DSA indexer 8,448 B pages
    assert period([100, 4096], 512) == 128
