"""What only a GPU node with SGLang proves: the L3 backend under SGLang's real kvcacheio / JIT copy kernels with
pinned (cudaHostRegister'd) host pools. Skipped elsewhere with the reason it carries."""

import pytest
import torch

from l3kit import write_config


@pytest.mark.gpu(reason="proves the L3 backend under SGLang's real HiCache kernels (kernel I/O, page_first and "
                        "layer_first) with pinned host pools: write-back -> L2 eviction -> prefetch from L3 -> "
                        "load-back restores every KV and indexer byte on the device")
@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_pinned_host_pools_and_real_kernels_round_trip_through_l3(tmp_path, plugin, layout, sglang_state):
    from sglang_glm_ext.l3.demo import stack

    spec = stack.StackSpec(layers=8, layout=layout, io_backend="kernel", device="cuda")
    sa = stack.publish_server_args(spec, storage_backend=None, extra_config='{"prefetch_threshold": 64}',
                                   plugin_values={"enable_cp_l3": True, "cp_l3_config": write_config(tmp_path)})
    st = stack.DsaStack.build(spec, sa)
    try:
        assert st.host_pool("kv").pin_memory is True
        tokens = list(range(1, 1 + 6 * 64))
        slots = st.insert(tokens)
        st.fill_device(slots, seed=1)
        want = st.snapshot_device(slots)
        st.write_back_storage(tokens)
        st.evict_device(len(tokens))
        st.evict_host(len(tokens))
        for pool in (st.kv_pool,):
            for buf in (*pool.kv_buffer, *pool.index_k_with_scale_buffer):
                buf.zero_()
        assert st.prefetch(tokens, "gpu") == len(tokens)
        got = st.snapshot_device(st.load_back(tokens))
        torch.cuda.synchronize()
        assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(got, want))
    finally:
        st.close()
