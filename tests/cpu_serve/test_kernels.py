"""cpu_serve/kernels.py: each torch stand-in against a reference. Where SGLang has a reference (its Triton kernels:
act_quant, the index-K page writer, assign_req_to_token_pool) it runs under Triton's CPU interpreter
(TRITON_INTERPRET=1, a fresh interpreter since Triton reads it at import); the Hadamard transform against SciPy's
Sylvester matrix; the copies against per-row loops over the layouts SGLang's host pools use."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from sglang_glm_ext.cpu_serve import kernels as k


def _interpreted(code: str) -> dict:
    """Run `code` with TRITON_INTERPRET=1 in a fresh interpreter; it prints one JSON line."""
    import os

    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------- DSA indexer half
@pytest.mark.slow
def test_act_quant_matches_sglangs_triton_kernel():
    # Scales must be bit-exact. The fp8 values: Triton's CPU interpreter converts float32 -> e4m3 without the carry
    # into the exponent (124.3 becomes 64, not 128), so where they differ ours must be the nearer e4m3 value (the
    # round-to-nearest a GPU's cvt.rn gives), and they must agree almost everywhere.
    torch.manual_seed(0)
    x = (torch.randn(7, 256) * 3).to(torch.bfloat16)
    torch.save(x, "/tmp/glm_ext_actq_x.pt")
    ref = _interpreted("""
        import json, torch
        from sglang.kernels.ops.quantization.act_quant_triton import act_quant
        x = torch.load("/tmp/glm_ext_actq_x.pt")
        out = {}
        for fmt in (None, "ue8m0"):
            y, s = act_quant(x, 128, fmt)
            out[str(fmt)] = [y.float().flatten().tolist(), s.flatten().tolist()]
        print(json.dumps(out))
    """)
    for fmt in (None, "ue8m0"):
        y, s = k.act_quant(x, 128, fmt)
        assert y.dtype == torch.float8_e4m3fn and s.dtype == torch.float32 and s.shape == (7, 2)
        assert torch.equal(s.flatten(), torch.tensor(ref[str(fmt)][1])), fmt
        got, want = y.float().flatten(), torch.tensor(ref[str(fmt)][0])
        exact = (x.float().reshape(-1, 2, 128) / s.unsqueeze(-1)).clamp(-448, 448).flatten()
        differ = got != want
        assert differ.float().mean() < 0.1, fmt
        assert torch.all((got - exact).abs()[differ] <= (want - exact).abs()[differ]), fmt


@pytest.mark.slow
def test_set_k_and_s_matches_sglangs_triton_page_writer():
    torch.manual_seed(1)
    key = torch.randn(9, 128).to(torch.float8_e4m3fn)
    scale = torch.rand(9, 1, dtype=torch.float32)
    loc = torch.tensor([0, 5, 63, 64, 65, 100, 127, 130, 191], dtype=torch.int64)
    torch.save((key, scale, loc), "/tmp/glm_ext_setks.pt")
    ref = _interpreted("""
        import json, torch
        from sglang.kernels.ops.kvcache.dsa_index_k_cache import _set_k_and_s_triton
        key, scale, loc = torch.load("/tmp/glm_ext_setks.pt")
        buf = torch.zeros(3, 64 * 132, dtype=torch.uint8)
        _set_k_and_s_triton(buf=buf, loc=loc, index_k=key, index_k_scale=scale, page_size=64)
        print(json.dumps(buf.flatten().tolist()))
    """)
    buf = torch.zeros(3, 64 * 132, dtype=torch.uint8)
    k.set_k_and_s(buf, loc, key, scale, 64)
    assert buf.flatten().tolist() == ref
    assert buf.any()


def test_set_k_and_s_refuses_a_page_of_the_wrong_size():
    with pytest.raises(ValueError, match="does not hold"):
        k.set_k_and_s(torch.zeros(1, 100, dtype=torch.uint8), torch.tensor([0]),
                      torch.zeros(1, 128).to(torch.float8_e4m3fn), torch.ones(1, 1), 64)


def test_hadamard_is_sylvesters_matrix_scaled():
    from scipy.linalg import hadamard

    x = torch.randn(5, 3, 128)
    got = k.hadamard_transform(x, scale=128 ** -0.5)
    want = x.reshape(-1, 128).double() @ torch.from_numpy(hadamard(128)).double() * 128 ** -0.5
    assert torch.allclose(got.reshape(-1, 128).double(), want, atol=1e-5)
    xb = x.to(torch.bfloat16)
    assert k.hadamard_transform(xb).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="power-of-2"):
        k.hadamard_transform(torch.zeros(2, 96))


# ---------------------------------------------------------------------------------------------- sgl_kernel names
@pytest.mark.slow
def test_assign_req_to_token_pool_matches_sglangs_triton_kernel():
    req_to_token = torch.zeros(4, 40, dtype=torch.int32)
    req_pool_indices = torch.tensor([2, 0, 3], dtype=torch.int64)
    start = torch.tensor([3, 0, 10], dtype=torch.int64)
    end = torch.tensor([9, 5, 30], dtype=torch.int64)
    out = torch.arange(100, 100 + 31, dtype=torch.int64)
    torch.save((req_to_token, req_pool_indices, start, end, out), "/tmp/glm_ext_assign.pt")
    ref = _interpreted("""
        import json, torch
        from sglang.srt.mem_cache.allocation import assign_req_to_token_pool
        r2t, idx, start, end, out = torch.load("/tmp/glm_ext_assign.pt")
        assign_req_to_token_pool[(3,)](idx, r2t, start, end, out, r2t.shape[1], 4)
        print(json.dumps(r2t.tolist()))
    """)
    k.assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start, end, out, 40)
    assert req_to_token.tolist() == ref
    with pytest.raises(ValueError, match="pool_len"):
        k.assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start, end, out, 41)


def test_copy_all_layer_kv_cache_moves_rows_in_every_buffer():
    bufs = [torch.arange(10 * 6, dtype=torch.int16).reshape(10, 6).clone(),
            torch.randn(10, 3, dtype=torch.float32)]
    before = [b.clone() for b in bufs]
    ptrs = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.int64)
    strides = torch.tensor([b.stride(0) * b.element_size() for b in bufs], dtype=torch.int64)
    src, tgt = torch.tensor([1, 2, 7]), torch.tensor([2, 8, 1])  # 2 is both read and written: reads come first
    k.copy_all_layer_kv_cache_cpu(ptrs, strides, tgt, src)
    for b, old in zip(bufs, before):
        want = old.clone()
        for s, t in zip(src.tolist(), tgt.tolist()):
            want[t] = old[s]
        assert torch.equal(b, want)


# ---------------------------------------------------------------------------------------------- kvcacheio copies
def _ptrs(layers):
    return torch.tensor([t.data_ptr() for t in layers], dtype=torch.int64)


@pytest.mark.parametrize("mha", [False, True])
def test_kernel_io_layer_first_round_trip_equals_row_loops(mha):
    L, rows, width = 3, 12, 16
    dev = [torch.randn(rows, width) for _ in range(L)]
    host = [torch.zeros(rows * 2, width) for _ in range(L)]
    d_idx, h_idx = torch.tensor([1, 4, 5, 9]), torch.tensor([20, 3, 7, 0])
    item = width * 4
    if mha:
        dev_v = [torch.randn(rows, width) for _ in range(L)]
        host_v = [torch.zeros(rows * 2, width) for _ in range(L)]
        k.transfer_kv_all_layer(_ptrs(dev), _ptrs(host), _ptrs(dev_v), _ptrs(host_v), d_idx, h_idx, item, L)
    else:
        k.transfer_kv_all_layer_mla(_ptrs(dev), _ptrs(host), d_idx, h_idx, item, L)
    for layer in range(L):
        for d, h in zip(d_idx.tolist(), h_idx.tolist()):
            assert torch.equal(host[layer][h], dev[layer][d])
            if mha:
                assert torch.equal(host_v[layer][h], dev_v[layer][d])
    back = [torch.zeros(rows, width) for _ in range(L)]
    for layer in range(L):
        if mha:
            back_v = torch.zeros(rows, width)
            k.transfer_kv_per_layer(host[layer], back[layer], host_v[layer], back_v, h_idx, d_idx, item)
            assert torch.equal(back_v[d_idx], dev_v[layer][d_idx])
        else:
            k.transfer_kv_per_layer_mla(host[layer], back[layer], h_idx, d_idx, item)
        assert torch.equal(back[layer][d_idx], dev[layer][d_idx])


@pytest.mark.parametrize("mha", [False, True])
def test_kernel_io_page_first_host_layout(mha):
    # page_first host buffer: (tokens, layers, row); a token's layer-l row sits at l * item inside its token stride.
    L, rows, width = 2, 8, 4
    dev = [torch.randn(rows, width) for _ in range(L)]
    host = torch.zeros(16, L, width)
    d_idx, h_idx = torch.tensor([0, 3, 6]), torch.tensor([5, 1, 15])
    item, layout_dim = width * 4, L * width * 4
    if mha:
        dev_v = [torch.randn(rows, width) for _ in range(L)]
        host_v = torch.zeros(16, L, width)
        k.transfer_kv_all_layer_lf_pf(_ptrs(dev), host, _ptrs(dev_v), host_v, d_idx, h_idx, item, layout_dim, L)
    else:
        k.transfer_kv_all_layer_mla_lf_pf(_ptrs(dev), host, d_idx, h_idx, item, layout_dim, L)
    for layer in range(L):
        for d, h in zip(d_idx.tolist(), h_idx.tolist()):
            assert torch.equal(host[h, layer], dev[layer][d])
    for layer in range(L):
        back = torch.zeros(rows, width)
        if mha:
            back_v = torch.zeros(rows, width)
            k.transfer_kv_per_layer_pf_lf(host, back, host_v, back_v, h_idx, d_idx, layer, item, layout_dim)
            assert torch.equal(back_v[d_idx], dev_v[layer][d_idx])
        else:
            k.transfer_kv_per_layer_mla_pf_lf(host, back, h_idx, d_idx, layer, item, layout_dim)
        assert torch.equal(back[d_idx], dev[layer][d_idx])


def test_direct_io_layer_first_and_page_first_direct():
    ps, L = 4, 3
    dev = [torch.randn(16, 1, 8) for _ in range(L)]
    d_idx = torch.arange(4, 12)
    h_idx = torch.arange(8, 16)
    host_lf = [torch.zeros(32, 1, 8) for _ in range(L)]
    k.transfer_kv_direct(dev, host_lf, d_idx, h_idx, ps)
    for layer in range(L):
        assert torch.equal(host_lf[layer][h_idx], dev[layer][d_idx])
    host_pf = torch.zeros(8, L, ps, 1, 8)  # page_first_direct: (pages, layers, page_size, ...)
    k.transfer_kv_all_layer_direct_lf_pf(dev, [host_pf], d_idx, h_idx, ps)
    for layer in range(L):
        for d, h in zip(d_idx.tolist(), h_idx.tolist()):
            assert torch.equal(host_pf[h // ps, layer, h % ps], dev[layer][d])
        back = torch.zeros(16, 1, 8)
        k.transfer_kv_per_layer_direct_pf_lf([host_pf], [back], h_idx, d_idx, layer, ps)
        assert torch.equal(back[d_idx], dev[layer][d_idx])
    with pytest.raises(ValueError, match="do not split"):
        k.transfer_kv_all_layer_direct_lf_pf(dev, [host_pf, host_pf], d_idx, h_idx, ps)


def test_kernel_io_refuses_a_non_contiguous_tensor():
    t = torch.zeros(8, 4)[:, :2]
    with pytest.raises(ValueError, match="contiguous"):
        k.transfer_kv_per_layer_mla(t, torch.zeros(8, 2), torch.tensor([0]), torch.tensor([0]), 8)


# ---------------------------------------------------------------------------------------------- dummy weights
def test_scaled_dummy_init_is_deterministic_per_name_and_scaled():
    def params():
        return [("model.embed_tokens.weight", torch.zeros(64, 32, dtype=torch.bfloat16)),
                ("model.layers.0.self_attn.q_proj.weight", torch.zeros(32, 32, dtype=torch.bfloat16)),
                ("model.layers.0.self_attn.k_proj.weight", torch.zeros(32, 32, dtype=torch.bfloat16)),
                ("model.layers.0.input_layernorm.weight", torch.zeros(32, dtype=torch.bfloat16)),
                ("model.layers.1.mlp.gate.e_score_correction_bias", torch.ones(4)),
                ("model.layers.0.mlp.experts.w13_weight", torch.zeros(4, 16, 32, dtype=torch.bfloat16)),
                ("ids", torch.zeros(3, dtype=torch.int64))]

    a, b = params(), params()
    assert k.scaled_dummy_init(a, seed=0) == 6 and k.scaled_dummy_init(b, seed=0) == 6
    for (n, x), (_, y) in zip(a, b):
        assert torch.equal(x, y), n  # the same on every launch
    d = dict(a)
    assert not torch.equal(d["model.layers.0.self_attn.q_proj.weight"], d["model.layers.0.self_attn.k_proj.weight"])
    assert torch.all(d["model.layers.0.input_layernorm.weight"] == 1)
    assert torch.all(d["model.layers.1.mlp.gate.e_score_correction_bias"] == 0)
    assert 0.1 < float(d["model.layers.0.self_attn.q_proj.weight"].float().std()) < 0.3  # ~ 1/sqrt(32)
    assert 0.8 < float(d["model.embed_tokens.weight"].float().std()) < 1.2
    c = params()
    k.scaled_dummy_init(c, seed=1)
    assert not torch.equal(dict(c)["model.embed_tokens.weight"], d["model.embed_tokens.weight"])
