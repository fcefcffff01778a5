import ctypes

import numpy as np
import pytest

from sglang_glm_ext.l3.disk.aligned import AlignedBuffer, buffer_address, is_aligned


def test_buffer_is_page_aligned_writable_and_exact_size():
    with AlignedBuffer(3_274_752 + 128) as buf:
        assert buf.address % 4096 == 0 and is_aligned(buf) and is_aligned(buf.view)
        assert len(buf.view) == 3_274_752 + 128 and buf.capacity % 4096 == 0
        buf.view[-1] = 0xAB
        assert ctypes.string_at(buf.address + len(buf) - 1, 1) == b"\xab"  # .address is the view's memory


def test_is_aligned_on_addresses_and_buffers():
    assert is_aligned(8192, 4096) and not is_aligned(8192 + 512, 4096) and is_aligned(8192 + 512, 512)
    with AlignedBuffer(8192) as buf:
        assert not is_aligned(buf.view[100:], 4096)
        assert buffer_address(buf.view[100:]) == buf.address + 100
    arr = np.zeros(10, dtype=np.uint8)
    assert buffer_address(arr[3:]) == arr.ctypes.data + 3
    assert buffer_address(bytes(5)) != 0  # read-only buffers have addresses too


def test_close_refuses_while_a_slice_is_held_then_succeeds():
    buf = AlignedBuffer(4096)
    held = buf.view[10:20]
    with pytest.raises(BufferError):
        buf.close()
    assert not buf.closed  # still usable after the refused close
    buf.view[0] = 1
    held.release()
    buf.close()
    assert buf.closed
    with pytest.raises(ValueError):
        buf.view
    buf.close()  # idempotent


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_bad_size_is_loud(bad):
    with pytest.raises(ValueError):
        AlignedBuffer(bad)
