"""The GPU bring-up stand-ins' torch ops against independent references (float64 formulas, plain loops over each
op's documented semantics). torch runs them the same way on a CPU; the Triton row copy and SGLang's JIT kernels
need a GPU (test_gpu.py)."""

import math
import random

import pytest
import torch

from sglang_glm_ext.gpu_bringup import kernels as K


def _rms_ref(x, w, eps, gemma=False):
    x64, w64 = x.double(), w.double() + (1.0 if gemma else 0.0)
    return x64 / torch.sqrt((x64 * x64).mean(-1, keepdim=True) + eps) * w64


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("gemma", [False, True])
def test_rmsnorm_and_its_fused_add(dtype, gemma):
    g = torch.Generator().manual_seed(1)
    x, r = torch.randn(7, 96, generator=g).to(dtype), torch.randn(7, 96, generator=g).to(dtype)
    w = (torch.rand(96, generator=g) + 0.5).to(dtype)
    norm, fused = (K.gemma_rmsnorm, K.gemma_fused_add_rmsnorm) if gemma else (K.rmsnorm, K.fused_add_rmsnorm)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(norm(x, w, 1e-6).double(), _rms_ref(x, w, 1e-6, gemma), **tol)
    out = torch.empty_like(x)
    assert norm(x, w, 1e-6, out=out) is out and torch.equal(out, norm(x, w, 1e-6))
    xi, ri = x.clone(), r.clone()
    assert fused(xi, ri, w, 1e-6) is None  # in place, as the real op
    s = x.double() + r.double()
    torch.testing.assert_close(ri.double(), s.to(dtype).double(), atol=0, rtol=0)
    torch.testing.assert_close(xi.double(), _rms_ref(s, w, 1e-6, gemma), **tol)


@pytest.mark.parametrize("name,act", [("silu_and_mul", lambda a: a / (1 + torch.exp(-a))),
                                      ("gelu_and_mul", lambda a: 0.5 * a * (1 + torch.erf(a / math.sqrt(2)))),
                                      ("gelu_tanh_and_mul", lambda a: 0.5 * a * (1 + torch.tanh(
                                          math.sqrt(2 / math.pi) * (a + 0.044715 * a ** 3))))])
def test_activation_and_mul(name, act):
    x = torch.randn(5, 2 * 36, generator=torch.Generator().manual_seed(2))  # d = 36: not a multiple of 8
    want = act(x[:, :36].double()) * x[:, 36:].double()
    torch.testing.assert_close(getattr(K, name)(x).double(), want, atol=1e-5, rtol=1e-5)
    out = torch.empty(5, 36)
    assert getattr(K, name)(x, out) is out and torch.allclose(out.double(), want, atol=1e-5)


@pytest.mark.parametrize("scale", [None, 2.5])
def test_moe_sum_reduce(scale):
    x = torch.randn(9, 4, 16, generator=torch.Generator().manual_seed(3)).bfloat16()
    out = torch.empty(9, 16, dtype=torch.bfloat16)
    K.moe_sum_reduce(x, out, scale)
    torch.testing.assert_close(out.double(), (x.double().sum(1) * (scale or 1.0)).bfloat16().double(),
                               atol=1e-2, rtol=1e-2)


def _align_ref(topk_ids, buckets, block):
    """The op's semantics by hand: per-bucket slot lists (index order), padded."""
    flat = [int(v) + 1 for v in topk_ids.reshape(-1)]
    per = [[i for i, b in enumerate(flat) if b == e] for e in range(buckets)]
    cums, total = [0], 0
    for p in per:
        total += -(-len(p) // block) * block
        cums.append(total)
    return per, cums


@pytest.mark.parametrize("tokens,topk,experts,block", [(1, 2, 8, 16), (37, 4, 8, 16), (130, 8, 64, 64),
                                                       (5, 2, 256, 16)])
def test_moe_align_block_size(tokens, topk, experts, block):
    rng = random.Random(tokens)
    ids = torch.tensor([[rng.randrange(-1, experts) for _ in range(topk)] for _ in range(tokens)], dtype=torch.int32)
    buckets, n = experts + 1, tokens * topk
    cap = (n * block if n < buckets else n + buckets * (block - 1)) + 3
    sorted_ids = torch.full((cap,), -7, dtype=torch.int32)
    expert_ids = torch.full((-(-cap // block),), -7, dtype=torch.int32)
    post = torch.zeros(1, dtype=torch.int32)
    cumsum = torch.full((buckets + 1,), -7, dtype=torch.int32)
    K.moe_align_block_size(ids, buckets, block, sorted_ids, expert_ids, post, cumsum, True)
    per, cums = _align_ref(ids, buckets, block)
    assert cumsum.tolist() == cums and post.item() == cums[-1]
    for b, slots in enumerate(per):
        seg = sorted_ids[cums[b]:cums[b + 1]].tolist()
        assert seg == slots + [n] * (len(seg) - len(slots))  # the bucket's slots in index order, then padding
        assert expert_ids[cums[b] // block:cums[b + 1] // block].tolist() == [b - 1] * ((cums[b + 1] - cums[b])
                                                                                     // block)
    assert (sorted_ids[cums[-1]:] == n).all()


def test_renorms_keep_ties_and_the_minimal_mass_set():
    p = torch.tensor([[0.1, 0.3, 0.3, 0.2, 0.1], [0.5, 0.25, 0.125, 0.0625, 0.0625]])
    k = K.top_k_renorm_prob(p, torch.tensor([2, 3]))
    assert torch.allclose(k[0], torch.tensor([0, 0.5, 0.5, 0, 0]))  # k = 2 with the pivot value tied
    assert torch.allclose(k[1], torch.tensor([0.5, 0.25, 0.125, 0, 0]) / 0.875)
    assert torch.equal(K.top_k_renorm_prob(p, 1 << 30), p / p.sum(-1, keepdim=True))
    t = K.top_p_renorm_prob(p, torch.tensor([0.55, 0.75]))
    assert torch.allclose(t[0], torch.tensor([0, 0.5, 0.5, 0, 0]))  # 0.3 + 0.3 reaches 0.55; 0.3 alone does not
    assert torch.allclose(t[1], torch.tensor([0.5, 0.25, 0, 0, 0]) / 0.75)  # 0.5 + 0.25 = 0.75 reaches it
    assert k.dtype == t.dtype == torch.float32


def test_weak_ref_tensor_passes_a_cpu_tensor_and_anything_else_through():
    t = torch.arange(4)
    assert K.weak_ref_tensor(t) is t and K.weak_ref_tensor(3) == 3


def test_direct_io_copies_runs_of_rows_for_every_layer():
    src = [torch.arange(40 * 6, dtype=torch.float32).reshape(40, 2, 3) + 1000 * layer for layer in range(3)]
    dst = [torch.zeros(40, 2, 3) for _ in range(3)]
    s = torch.tensor([0, 1, 2, 3, 8, 9, 10, 11])
    d = torch.tensor([20, 21, 22, 23, 4, 5, 6, 7])
    K.transfer_kv_direct(src, dst, s, d, page_size=4)
    for a, b in zip(src, dst):
        assert torch.equal(b[d], a[s]) and not b[[0, 1, 2, 3, 8, 30]].any()
    with pytest.raises(ValueError, match="whole pages"):
        K.transfer_kv_direct(src, dst, s[:3], d[:3], page_size=4)


def test_direct_page_first_load_and_backup_round_trip():
    ps, layers, pages = 4, 3, 5
    host = torch.arange(pages * layers * ps * 2, dtype=torch.float32).reshape(pages, layers, ps, 1, 2)
    dev = [torch.zeros(32, 1, 2) for _ in range(layers)]
    host_idx = torch.arange(2 * ps, 4 * ps)  # host pages 2 and 3
    dev_idx = torch.cat([torch.arange(8, 12), torch.arange(20, 24)])
    for layer in range(layers):
        K.transfer_kv_per_layer_direct_pf_lf([host], [dev[layer]], host_idx, dev_idx, layer, ps)
        assert torch.equal(dev[layer][8:12], host[2, layer]) and torch.equal(dev[layer][20:24], host[3, layer])
    back = torch.zeros_like(host)
    K.transfer_kv_all_layer_direct_lf_pf(dev, [back], dev_idx, torch.arange(0, 2 * ps), ps)
    assert torch.equal(back[0], host[2]) and torch.equal(back[1], host[3]) and not back[2:].any()


def test_the_row_copy_refuses_what_the_real_kernel_refuses():
    idx = torch.arange(2)
    with pytest.raises(ValueError, match="not a multiple of 8 bytes"):
        K.copy_rows([0], [0], idx, idx, 12)
    with pytest.raises(ValueError, match="2 source and 3 destination"):
        K.copy_rows([0], [0], idx, torch.arange(3), 16)
    K.copy_rows([0], [0], idx[:0], idx[:0], 16)  # nothing to copy: no kernel, no error
