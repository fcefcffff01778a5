"""The GPU bring-up stand-ins on a CUDA GPU, each against a reference: the HiCache copies (SGLang's JIT kernels where
the stand-in hands them over, the Triton row copy otherwise, both forced in turn) between pinned host and device
memory for every layout and row size the served models use; SGLang's JIT moe_align against the torch op; the
torch ops inside a CUDA graph; weak_ref_tensor's non-owning alias."""

import importlib
import sys

import pytest
import torch

from sglang_glm_ext.gpu_bringup import gate, kernels as K

pytestmark = pytest.mark.gpu(reason="proves the GPU bring-up stand-ins on CUDA tensors and registered host memory: "
                                    "every kvcacheio copy (SGLang's JIT and the Triton row copy) byte-exact against "
                                    "indexing, moe_align against the torch op, the ops under CUDA graph capture")

# Row bytes of the served models: GLM-4 MHA (256), GLM-5 MLA (1152), GLM-5 DSA indexer page at page 64 (8448), and
# one the JIT register kernel cannot tile (72: the Triton copy's).
ROWS = [256, 1152, 8448, 72]


@pytest.fixture
def kvio(monkeypatch):
    for name in [m for m in sys.modules if m == "sgl_kernel" or m.startswith("sgl_kernel.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(gate.SHADOW_DIR)
    mod = importlib.import_module("sgl_kernel.kvcacheio")
    yield mod
    for name in [m for m in sys.modules if m == "sgl_kernel" or m.startswith("sgl_kernel.")]:
        sys.modules.pop(name, None)


def _pinned(shape):
    t = torch.empty(shape, dtype=torch.uint8).pin_memory()
    t.copy_(torch.randint(0, 256, shape, dtype=torch.uint8))
    return t


def _ptrs(tensors):
    return torch.tensor([t.data_ptr() for t in tensors], dtype=torch.uint64, device="cuda")


@pytest.mark.parametrize("jit", [True, False])
@pytest.mark.parametrize("item", ROWS)
def test_every_kvcacheio_copy_is_byte_exact(kvio, monkeypatch, jit, item):
    monkeypatch.setattr(kvio, "USE_JIT", jit)
    layers, rows, n = 3, 64, 24
    g = torch.Generator().manual_seed(item)
    src_i = torch.randperm(rows, generator=g)[:n].cuda()
    dst_i = torch.randperm(rows, generator=g)[:n].cuda()
    s_cpu, d_cpu = src_i.cpu(), dst_i.cpu()
    # layer_first: one (rows, item) buffer a layer; page_first host: (rows, layers, item)
    host_lf = [_pinned((rows, item)) for _ in range(layers)]
    host_pf = _pinned((rows, layers, item))
    dev = [torch.zeros(rows, item, dtype=torch.uint8, device="cuda") for _ in range(layers)]

    kvio.transfer_kv_per_layer_mla(host_lf[1], dev[1], src_i, dst_i, item)  # load, layer_first
    torch.cuda.synchronize()
    assert torch.equal(dev[1].cpu()[d_cpu], host_lf[1][s_cpu])
    for layer in range(layers):  # load, page_first -> layer_first
        kvio.transfer_kv_per_layer_mla_pf_lf(host_pf, dev[layer], src_i, dst_i, layer, item, layers * item)
    torch.cuda.synchronize()
    for layer in range(layers):
        assert torch.equal(dev[layer].cpu()[d_cpu], host_pf[:, layer][s_cpu]), layer
    back_lf = [_pinned((rows, item)) for _ in range(layers)]
    before = [b.clone() for b in back_lf]
    kvio.transfer_kv_all_layer_mla(_ptrs(dev), _ptrs(back_lf), dst_i, src_i, item, layers)  # backup, pointer tables
    torch.cuda.synchronize()
    for layer in range(layers):
        want = before[layer].clone()
        want[s_cpu] = dev[layer].cpu()[d_cpu]
        assert torch.equal(back_lf[layer], want), layer
    back_pf = _pinned((rows, layers, item))
    before_pf = back_pf.clone()
    kvio.transfer_kv_all_layer_mla_lf_pf(_ptrs(dev), back_pf, dst_i, src_i, item, layers * item, layers)
    torch.cuda.synchronize()
    want = before_pf.clone()
    for layer in range(layers):
        want[s_cpu, layer] = dev[layer].cpu()[d_cpu]
    assert torch.equal(back_pf, want)
    # MHA: K and V through the same ops
    dev_v = [torch.zeros_like(d) for d in dev]
    kvio.transfer_kv_per_layer(host_lf[0], dev[0], host_lf[2], dev_v[0], src_i, dst_i, item)
    torch.cuda.synchronize()
    assert torch.equal(dev_v[0].cpu()[d_cpu], host_lf[2][s_cpu])
    if jit and item % 128 == 0:
        assert not kvio.FALLBACKS, f"SGLang's JIT kernel was not used: {kvio.FALLBACKS}"


def test_sglangs_jit_moe_align_agrees_with_the_torch_op(monkeypatch):
    monkeypatch.syspath_prepend(gate.SHADOW_DIR)
    monkeypatch.delitem(sys.modules, "sgl_kernel", raising=False)  # the stand-in fresh; whatever was there, back after
    sk = importlib.import_module("sgl_kernel")
    g = torch.Generator().manual_seed(5)
    for tokens, topk, experts, block in [(3, 2, 8, 16), (200, 8, 64, 64), (1000, 8, 256, 64)]:
        ids = torch.randint(-1, experts, (tokens, topk), generator=g, dtype=torch.int32).cuda()
        buckets, n = experts + 1, tokens * topk
        cap = n * block if n < buckets else n + buckets * (block - 1)
        cap = -(-cap // 4) * 4
        outs = []
        for fn in (sk.moe_align_block_size, K.moe_align_block_size):
            bufs = (torch.empty(cap, dtype=torch.int32, device="cuda"),
                    torch.empty(-(-cap // block), dtype=torch.int32, device="cuda"),
                    torch.empty(1, dtype=torch.int32, device="cuda"),
                    torch.empty(buckets + 1, dtype=torch.int32, device="cuda"))
            fn(ids, buckets, block, *bufs, True)
            outs.append([b.cpu() for b in bufs])
        (s1, e1, p1, _), (s2, e2, p2, c2) = outs
        total = int(p2)
        # cumsum_buffer is the kernels' scratch (SGLang's caller returns sorted ids, expert ids and the padded
        # count only; the JIT kernel leaves it unwritten): the buckets' bounds are the torch op's
        assert int(p1) == total
        assert torch.equal(e1[:total // block], e2[:total // block])
        for b in range(buckets):  # order inside a bucket is the kernel's own
            lo, hi = int(c2[b]), int(c2[b + 1])
            assert sorted(s1[lo:hi].tolist()) == sorted(s2[lo:hi].tolist()), b


def test_the_torch_ops_run_inside_a_cuda_graph():
    x = torch.randn(8, 256, device="cuda", dtype=torch.bfloat16)
    r, w = torch.randn_like(x), torch.rand(256, device="cuda", dtype=torch.bfloat16)
    ids = torch.randint(0, 8, (8, 2), device="cuda", dtype=torch.int32)
    bufs = (torch.empty(8 * 2 + 9 * 15 + 3, dtype=torch.int32, device="cuda"),
            torch.empty(20, dtype=torch.int32, device="cuda"), torch.empty(1, dtype=torch.int32, device="cuda"),
            torch.empty(10, dtype=torch.int32, device="cuda"))
    xs, rs = x.clone(), r.clone()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):  # warm-up off the capture, as SGLang does
        K.fused_add_rmsnorm(x.clone(), r.clone(), w)
        K.moe_align_block_size(ids, 9, 16, *bufs, True)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        K.fused_add_rmsnorm(xs, rs, w)
        K.moe_align_block_size(ids, 9, 16, *bufs, True)
    xs.copy_(x)
    rs.copy_(r)
    graph.replay()
    torch.cuda.synchronize()
    want_x, want_r = x.clone(), r.clone()
    K.fused_add_rmsnorm(want_x, want_r, w)
    assert torch.equal(xs, want_x) and torch.equal(rs, want_r)
    assert int(bufs[2]) == int(bufs[3][9])


def test_weak_ref_tensor_aliases_without_owning():
    t = torch.arange(12, device="cuda", dtype=torch.bfloat16).reshape(3, 4)
    w = K.weak_ref_tensor(t)
    assert w.data_ptr() == t.data_ptr() and w.shape == t.shape and w.dtype == t.dtype and w.stride() == t.stride()
    t.add_(1)
    assert torch.equal(w, t)
    import gc
    import weakref

    owner = weakref.ref(t)
    del t
    gc.collect()
    assert owner() is None  # the alias keeps nothing of the original alive (the real op's torch::from_blob)
    assert w.shape == (3, 4)
