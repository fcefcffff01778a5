"""The ops of the GPU bring-up tier's ``sgl_kernel`` stand-in, in torch and Triton (the pure core of gpu_bringup).

Each function has the signature of the ``sgl_kernel`` op it stands in for (SGLang 0.5.23 passes these argument
names; docs_internal/gpu_bringup.md has the table) and reproduces its semantics; ``tests/gpu_bringup/`` checks each
against an independent reference, on this CPU for the torch ones and on a GPU for the Triton copies. Nothing here
imports SGLang: the stand-in package (``_shadow/sgl_kernel``) hands an op to SGLang's own run-time-compiled kernel
where one exists and falls back to these.

* norms (RMSNorm, Gemma's): fp32 math, the input's dtype out; ``enable_pdl`` is a launch hint and ignored.
* activation-and-mul (silu, exact gelu, tanh gelu): ``out = act(x[..., :d]) * x[..., d:]``.
* MoE: ``moe_sum_reduce`` (fp32 sum over top-k times the routed scale), ``moe_align_block_size`` (bucket =
  expert + 1, per-bucket counts padded to ``block_size``).
* sampling renorms (top-k with ties at the pivot kept, top-p minimal mass set), ``weak_ref_tensor`` (a
  non-owning alias of a CUDA tensor's storage).
* HiCache ``kvcacheio``: one Triton kernel copies rows of ``item_size`` bytes between any two bases of a pointer
  table (device memory, or host memory registered with CUDA: under unified addressing its host address is the
  device address, as SGLang's own fallback assumes), indexed by ``src_indices`` / ``dst_indices``; layer_first
  (``lf``) and page_first (``pf``: rows ``layout_dim`` bytes apart, a layer ``item_size`` bytes into its row)
  differ only in strides and offsets. The direct-I/O ops are torch copies of runs, as the real ones are.
"""

from __future__ import annotations

import functools
import math

__all__ = [
    "KVCACHEIO_NAMES", "PAGE_HEAD_NAMES", "STANDIN_NAMES", "UNAVAILABLE_NAMES", "rmsnorm", "fused_add_rmsnorm",
    "gemma_rmsnorm", "gemma_fused_add_rmsnorm", "silu_and_mul",
    "gelu_and_mul", "gelu_tanh_and_mul", "moe_sum_reduce", "moe_align_block_size", "top_k_renorm_prob",
    "top_p_renorm_prob", "weak_ref_tensor", "copy_rows", "transfer_kv_per_layer", "transfer_kv_per_layer_pf_lf",
    "transfer_kv_all_layer", "transfer_kv_all_layer_lf_pf", "transfer_kv_per_layer_mla",
    "transfer_kv_per_layer_mla_pf_lf", "transfer_kv_all_layer_mla", "transfer_kv_all_layer_mla_lf_pf",
    "transfer_kv_direct", "transfer_kv_per_layer_direct_pf_lf", "transfer_kv_all_layer_direct_lf_pf",
]

# What SGLang 0.5.23's host pools import from sgl_kernel.kvcacheio (pool_host/mha.py ~61 is the union but for
# transfer_kv_all_layer_mla); the page_head ones (MHA's page_head layout, not served by L3) stay unimplemented.
KVCACHEIO_NAMES = (
    "transfer_kv_per_layer", "transfer_kv_per_layer_pf_lf", "transfer_kv_all_layer", "transfer_kv_all_layer_lf_pf",
    "transfer_kv_per_layer_mla", "transfer_kv_per_layer_mla_pf_lf", "transfer_kv_all_layer_mla",
    "transfer_kv_all_layer_mla_lf_pf", "transfer_kv_direct", "transfer_kv_per_layer_direct_pf_lf",
    "transfer_kv_all_layer_direct_lf_pf",
)
PAGE_HEAD_NAMES = ("transfer_kv_per_layer_ph_lf", "transfer_kv_all_layer_lf_ph")
# What the stand-in package implements (the start-up warning names each), and what it imports only to raise.
STANDIN_NAMES = ("rmsnorm", "fused_add_rmsnorm", "gemma_rmsnorm", "gemma_fused_add_rmsnorm", "silu_and_mul",
                 "gelu_and_mul", "gelu_tanh_and_mul", "moe_sum_reduce", "moe_align_block_size", "top_k_renorm_prob",
                 "top_p_renorm_prob", "weak_ref_tensor", "utils.is_arch_support_pdl",
                 *(f"kvcacheio.{n}" for n in KVCACHEIO_NAMES))
# Imported at module level on the CUDA path by modules of other models and kernels (int8 / GGUF / cutlass MoE /
# expert-specialised grouped GEMMs, chunked-KV attention merges, MiniMax's embedding cache): defined so every such
# import succeeds, each raising by name if called.
UNAVAILABLE_NAMES = ("int8_scaled_mm", "moe_sum", "cutlass_w4a8_moe_mm", "get_cutlass_w4a8_moe_mm_data",
                     "es_fp8_blockwise_scaled_grouped_mm", "es_sm100_mxfp8_blockscaled_grouped_mm",
                     "es_sm100_mxfp8_blockscaled_grouped_quant", "fp8_blockwise_scaled_grouped_mm",
                     "merge_state_v2", "shuffle_rows", "quantization.ggml_dequantize", "quantization.ggml_moe_a8",
                     "quantization.ggml_mul_mat_a8", "quantization.ggml_mul_mat_vec_a8",
                     "kvcacheio.transfer_embedding_ranges_direct", *(f"kvcacheio.{n}" for n in PAGE_HEAD_NAMES))


# ---------------------------------------------------------------------------------------------- norms
def _rms(x, weight, eps: float, gemma: bool):
    import torch

    xf = x.float()
    w = weight.float() + 1.0 if gemma else weight.float()
    return xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps) * w


def rmsnorm(input, weight, eps: float = 1e-6, out=None, enable_pdl=None):
    """``out = input * rsqrt(mean(input^2) + eps) * weight`` (fp32 math); returns ``out`` (new if None)."""
    y = _rms(input, weight, eps, gemma=False).to(input.dtype)
    if out is None:
        return y
    out.copy_(y)
    return out


def fused_add_rmsnorm(input, residual, weight, eps: float = 1e-6, enable_pdl=None) -> None:
    """In place: ``residual <- input + residual``; ``input <- rmsnorm(input + residual)`` (the norm of the fp32 sum,
    not of its rounded copy, as FlashInfer's kernel does)."""
    s = input.float() + residual.float()
    residual.copy_(s.to(residual.dtype))
    input.copy_(_rms(s, weight, eps, gemma=False).to(input.dtype))


def gemma_rmsnorm(input, weight, eps: float = 1e-6, out=None, enable_pdl=None):
    y = _rms(input, weight, eps, gemma=True).to(input.dtype)
    if out is None:
        return y
    out.copy_(y)
    return out


def gemma_fused_add_rmsnorm(input, residual, weight, eps: float = 1e-6, enable_pdl=None) -> None:
    s = input.float() + residual.float()
    residual.copy_(s.to(residual.dtype))
    input.copy_(_rms(s, weight, eps, gemma=True).to(input.dtype))


# ---------------------------------------------------------------------------------------------- activations
def _act_and_mul(act, input, out):
    d = input.shape[-1] // 2
    y = (act(input[..., :d].float()) * input[..., d:].float()).to(input.dtype)
    if out is None:
        return y
    out.copy_(y)
    return out


def silu_and_mul(input, out=None, enable_pdl=None):
    import torch

    return _act_and_mul(torch.nn.functional.silu, input, out)


def gelu_and_mul(input, out=None, enable_pdl=None):
    import torch

    return _act_and_mul(lambda x: torch.nn.functional.gelu(x, approximate="none"), input, out)


def gelu_tanh_and_mul(input, out=None, enable_pdl=None):
    import torch

    return _act_and_mul(lambda x: torch.nn.functional.gelu(x, approximate="tanh"), input, out)


# ---------------------------------------------------------------------------------------------- MoE
def moe_sum_reduce(input_tensor, output_tensor, routed_scaling_factor=None) -> None:
    """``output[t] = routed_scaling_factor * sum_k input[t, k]`` (fp32 accumulation); None scales by 1."""
    scale = 1.0 if routed_scaling_factor is None else float(routed_scaling_factor)
    output_tensor.copy_((input_tensor.float().sum(dim=1) * scale).to(output_tensor.dtype))


def moe_align_block_size(topk_ids, num_experts, block_size, sorted_token_ids, experts_ids, num_tokens_post_pad,
                         cumsum_buffer, pad_sorted_token_ids=False, ignore_invalid_expert=False) -> None:
    """Group the flat top-k slots by bucket (``topk_ids + 1``: -1, an expert filtered out by EP, is bucket 0), each
    bucket's count padded to a multiple of ``block_size``; ``sorted_token_ids[cumsum[b] + r]`` is the flat index of
    bucket ``b``'s r-th slot (in index order), ``experts_ids[j]`` the bucket of block ``j`` minus 1,
    ``num_tokens_post_pad[0]`` the padded total, ``cumsum_buffer[:num_experts + 1]`` the exclusive prefix of the
    padded counts. ``num_experts`` counts buckets (SGLang passes experts + 1). No host sync (a decode CUDA graph
    captures it): blocks past the padded total get an expert id too, which the MoE kernel never reads."""
    import torch

    flat = topk_ids.reshape(-1).long() + 1
    if ignore_invalid_expert:  # an id outside the experts goes to bucket 0, as an EP-filtered one does
        flat = torch.where((flat >= 0) & (flat < num_experts), flat, torch.zeros_like(flat))
    n = flat.numel()
    counts = torch.zeros(num_experts, dtype=torch.long, device=flat.device).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_size - 1) // block_size * block_size
    cumsum = torch.zeros(num_experts + 1, dtype=torch.long, device=flat.device)
    cumsum[1:] = torch.cumsum(padded, 0)
    if pad_sorted_token_ids:
        sorted_token_ids.fill_(n)
    order = torch.sort(flat, stable=True).indices  # slots grouped by bucket, in index order within one
    bucket_of = flat[order]
    first = torch.cumsum(counts, 0) - counts  # unpadded start of each bucket in `order`
    rank = torch.arange(n, device=flat.device) - first[bucket_of]
    sorted_token_ids[cumsum[bucket_of] + rank] = order.to(sorted_token_ids.dtype)
    starts = torch.arange(experts_ids.numel(), device=flat.device) * block_size
    experts_ids.copy_((torch.searchsorted(cumsum[1:].contiguous(), starts, right=True) - 1).to(experts_ids.dtype))
    num_tokens_post_pad.reshape(-1)[:1].copy_(cumsum[-1:].to(num_tokens_post_pad.dtype))
    cumsum_buffer[: num_experts + 1] = cumsum.to(cumsum_buffer.dtype)


# ---------------------------------------------------------------------------------------------- sampling
def top_k_renorm_prob(probs, top_k):
    """Keep each row's ``top_k`` largest probabilities (every value equal to the k-th is kept), renormalised; a new
    fp32 tensor. ``top_k`` is an int or a per-row tensor; k >= the vocabulary keeps the row."""
    import torch

    p = probs.float()
    v = p.shape[-1]
    k = torch.as_tensor(top_k, device=p.device).reshape(-1).long().clamp(1, v).expand(p.shape[0])
    kth = torch.sort(p, dim=-1, descending=True).values.gather(1, (k - 1).unsqueeze(1))
    kept = torch.where(p >= kth, p, torch.zeros_like(p))
    return kept / kept.sum(dim=-1, keepdim=True)


def top_p_renorm_prob(probs, top_p):
    """Keep each row's smallest set of largest probabilities whose mass reaches ``top_p``, renormalised."""
    import torch

    p = probs.float()
    tp = torch.as_tensor(top_p, device=p.device, dtype=torch.float32).reshape(-1).expand(p.shape[0])
    sp, order = torch.sort(p, dim=-1, descending=True)
    before = torch.cumsum(sp, dim=-1) - sp  # the mass of the larger values
    keep_sorted = before < tp.unsqueeze(1)
    keep_sorted[:, 0] = True
    keep = torch.zeros_like(keep_sorted).scatter(1, order, keep_sorted)
    kept = torch.where(keep, p, torch.zeros_like(p))
    return kept / kept.sum(dim=-1, keepdim=True)


class _CudaArray:
    """``__cuda_array_interface__`` of raw device memory, so torch can alias it without owning it."""

    def __init__(self, ptr: int, shape, strides_bytes, typestr: str):
        self.__cuda_array_interface__ = {"data": (ptr, False), "shape": tuple(shape),
                                         "strides": tuple(strides_bytes), "typestr": typestr, "version": 3}


def weak_ref_tensor(tensor):
    """A tensor of the same shape, strides and dtype over the same CUDA memory that does not keep it alive (what
    the real op builds with ``torch::from_blob``); anything else is returned as it is."""
    import torch

    if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cuda":
        return tensor
    size = tensor.element_size()
    # Aliased as bytes (the interface has no bf16/fp8 type string), then viewed back: the last axis in bytes.
    shape = list(tensor.shape) or [1]
    strides = list(tensor.stride()) or [1]
    if tensor.dim() and strides[-1] != 1:
        return tensor  # a non-unit inner stride cannot be viewed as bytes: keep the owning reference
    raw = torch.as_tensor(_CudaArray(tensor.data_ptr(), shape[:-1] + [shape[-1] * size],
                                     [s * size for s in strides[:-1]] + [1], "|u1"), device=tensor.device)
    out = raw.view(tensor.dtype)
    return out.reshape(tensor.shape) if tensor.dim() == 0 else out


# ---------------------------------------------------------------------------------------------- kvcacheio (Triton)
@functools.lru_cache(maxsize=1)
def _copy_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def copy_rows_kernel(src_tab, dst_tab, src_idx, dst_idx, src_stride, dst_stride, src_layer_off, dst_layer_off,
                         words, BLOCK: tl.constexpr):
        i = tl.program_id(0)
        layer = tl.program_id(1)
        s = tl.load(src_idx + i).to(tl.int64)
        d = tl.load(dst_idx + i).to(tl.int64)
        sbase = tl.load(src_tab + layer).to(tl.pointer_type(tl.int64))
        dbase = tl.load(dst_tab + layer).to(tl.pointer_type(tl.int64))
        soff = (s * src_stride + layer * src_layer_off) // 8
        doff = (d * dst_stride + layer * dst_layer_off) // 8
        for w in range(0, words, BLOCK):
            o = w + tl.arange(0, BLOCK)
            m = o < words
            tl.store(dbase + doff + o, tl.load(sbase + soff + o, mask=m), mask=m)

    return copy_rows_kernel


def _table(ptrs, device):
    import torch

    if isinstance(ptrs, torch.Tensor):
        return ptrs.to(device=device).view(torch.int64) if ptrs.dtype != torch.int64 else ptrs.to(device)
    return torch.tensor([int(p) for p in ptrs], dtype=torch.int64, device=device)


def copy_rows(src_ptrs, dst_ptrs, src_indices, dst_indices, item_size: int, *, num_layers: int = 1,
              src_stride=None, dst_stride=None, src_layer_off: int = 0, dst_layer_off: int = 0) -> None:
    """For every layer ``l < num_layers`` and pair ``i``: ``item_size`` bytes from
    ``src_ptrs[l] + src_indices[i] * src_stride + l * src_layer_off`` to the same place on the destination side
    (strides default to ``item_size``). ``*_ptrs``: addresses (ints or an int64 / uint64 tensor), one per layer, or
    one for every layer. Runs on the current CUDA stream of the indices' device."""
    src_stride = item_size if src_stride is None else int(src_stride)
    dst_stride = item_size if dst_stride is None else int(dst_stride)
    for what, v in (("item_size", item_size), ("source stride", src_stride), ("destination stride", dst_stride),
                    ("source layer offset", src_layer_off), ("destination layer offset", dst_layer_off)):
        if v % 8:
            raise ValueError(f"kvcacheio stand-in: {what} {v} is not a multiple of 8 bytes")
    n = int(src_indices.numel())
    if n != int(dst_indices.numel()):
        raise ValueError(f"kvcacheio stand-in: {n} source and {dst_indices.numel()} destination indices")
    if n == 0 or num_layers == 0:
        return
    device = src_indices.device
    src_tab, dst_tab = _table(src_ptrs, device), _table(dst_ptrs, device)
    if src_tab.numel() == 1 and num_layers > 1:
        src_tab = src_tab.expand(num_layers).contiguous()
    if dst_tab.numel() == 1 and num_layers > 1:
        dst_tab = dst_tab.expand(num_layers).contiguous()
    if src_tab.numel() < num_layers or dst_tab.numel() < num_layers:
        raise ValueError(f"kvcacheio stand-in: pointer tables of {src_tab.numel()} / {dst_tab.numel()} layers for "
                         f"{num_layers}")
    words = item_size // 8
    block = min(1024, 1 << max(0, math.ceil(math.log2(max(words, 1)))))
    _copy_kernel()[(n, num_layers)](src_tab, dst_tab, src_indices, dst_indices, src_stride, dst_stride,
                                    src_layer_off, dst_layer_off, words, BLOCK=block)


def transfer_kv_per_layer_mla(src, dst, src_indices, dst_indices, item_size, block_quota=None,
                              num_warps_per_block=32) -> None:
    """layer_first -> layer_first, one layer: row ``i`` of ``src`` to row ``j`` of ``dst``."""
    copy_rows([src.data_ptr()], [dst.data_ptr()], src_indices, dst_indices, item_size)


def transfer_kv_per_layer_mla_pf_lf(src, dst, src_indices, dst_indices, layer_id, item_size, src_layout_dim,
                                    block_quota=2, num_warps_per_block=32) -> None:
    """page_first host -> layer_first device, one layer: ``src`` rows are ``src_layout_dim`` bytes apart, the layer
    ``layer_id * item_size`` bytes into each."""
    copy_rows([src.data_ptr() + layer_id * item_size], [dst.data_ptr()], src_indices, dst_indices, item_size,
              src_stride=src_layout_dim)


def transfer_kv_all_layer_mla(src_layers, dst_layers, src_indices, dst_indices, item_size, num_layers,
                              block_quota=2, num_warps_per_block=32) -> None:
    """Pointer tables (one base per layer) to pointer tables, every layer."""
    copy_rows(src_layers, dst_layers, src_indices, dst_indices, item_size, num_layers=num_layers)


def transfer_kv_all_layer_mla_lf_pf(src_layers, dst, src_indices, dst_indices, item_size, dst_layout_dim,
                                    num_layers, block_quota=2, num_warps_per_block=32) -> None:
    """Pointer table (layer_first device) to one page_first host buffer, every layer."""
    copy_rows(src_layers, [dst.data_ptr()], src_indices, dst_indices, item_size, num_layers=num_layers,
              dst_stride=dst_layout_dim, dst_layer_off=item_size)


def transfer_kv_per_layer(src_k, dst_k, src_v, dst_v, src_indices, dst_indices, item_size, block_quota=2,
                          num_warps_per_block=32) -> None:
    transfer_kv_per_layer_mla(src_k, dst_k, src_indices, dst_indices, item_size)
    transfer_kv_per_layer_mla(src_v, dst_v, src_indices, dst_indices, item_size)


def transfer_kv_per_layer_pf_lf(src_k, dst_k, src_v, dst_v, src_indices, dst_indices, layer_id, item_size,
                                src_layout_dim, block_quota=2, num_warps_per_block=32) -> None:
    transfer_kv_per_layer_mla_pf_lf(src_k, dst_k, src_indices, dst_indices, layer_id, item_size, src_layout_dim)
    transfer_kv_per_layer_mla_pf_lf(src_v, dst_v, src_indices, dst_indices, layer_id, item_size, src_layout_dim)


def transfer_kv_all_layer(src_k_layers, dst_k_layers, src_v_layers, dst_v_layers, src_indices, dst_indices,
                          item_size, num_layers, block_quota=2, num_warps_per_block=32) -> None:
    transfer_kv_all_layer_mla(src_k_layers, dst_k_layers, src_indices, dst_indices, item_size, num_layers)
    transfer_kv_all_layer_mla(src_v_layers, dst_v_layers, src_indices, dst_indices, item_size, num_layers)


def transfer_kv_all_layer_lf_pf(src_k_layers, dst_k, src_v_layers, dst_v, src_indices, dst_indices, item_size,
                                dst_layout_dim, num_layers, block_quota=2, num_warps_per_block=32) -> None:
    transfer_kv_all_layer_mla_lf_pf(src_k_layers, dst_k, src_indices, dst_indices, item_size, dst_layout_dim,
                                    num_layers)
    transfer_kv_all_layer_mla_lf_pf(src_v_layers, dst_v, src_indices, dst_indices, item_size, dst_layout_dim,
                                    num_layers)


# ---------------------------------------------------------------------------------------------- kvcacheio (direct)
def _rows(t):
    return t.reshape(t.shape[0], -1)


def _runs(src_indices, dst_indices):
    """Maximal runs where both index lists advance by one: (src start, dst start, length), from CPU copies."""
    s = [int(x) for x in src_indices.reshape(-1).tolist()]
    d = [int(x) for x in dst_indices.reshape(-1).tolist()]
    if len(s) != len(d):
        raise ValueError(f"kvcacheio stand-in: {len(s)} source and {len(d)} destination indices")
    out, i = [], 0
    while i < len(s):
        j = i + 1
        while j < len(s) and s[j] == s[j - 1] + 1 and d[j] == d[j - 1] + 1:
            j += 1
        out.append((s[i], d[i], j - i))
        i = j
    return out


def transfer_kv_direct(src_layers, dst_layers, src_indices, dst_indices, page_size) -> None:
    """Row runs ``src_layers[j][s:s+n] -> dst_layers[j][d:d+n]`` for every layer (tensors, any devices)."""
    if len(src_layers) != len(dst_layers):
        raise ValueError(f"kvcacheio stand-in: {len(src_layers)} source and {len(dst_layers)} destination layers")
    if src_indices.numel() % page_size:
        raise ValueError(f"kvcacheio stand-in: {src_indices.numel()} indices are not whole pages of {page_size}")
    for s, d, n in _runs(src_indices, dst_indices):
        for src, dst in zip(src_layers, dst_layers):
            _rows(dst)[d:d + n].copy_(_rows(src)[s:s + n], non_blocking=True)


def transfer_kv_per_layer_direct_pf_lf(src_ptrs, dst_ptrs, src_indices, dst_indices, layer_id, page_size) -> None:
    """page_first_direct host ``[pages, L, page_size, ...]`` -> layer_first device rows, one layer: for each page,
    ``dst[d:d+page_size] <- src[s // page_size][layer_id]`` (K then V, or the one MLA buffer)."""
    host = [t.reshape(t.shape[0], t.shape[1], page_size, -1) for t in src_ptrs]
    s_idx = src_indices.reshape(-1)[::page_size].tolist()
    d_idx = dst_indices.reshape(-1)[::page_size].tolist()
    for s, d in zip(s_idx, d_idx):
        for h, dev in zip(host, dst_ptrs):
            _rows(dev)[int(d):int(d) + page_size].copy_(h[int(s) // page_size, layer_id], non_blocking=True)


def transfer_kv_all_layer_direct_lf_pf(src_ptrs, dst_ptrs, src_indices, dst_indices, page_size) -> None:
    """layer_first device rows -> page_first_direct host, every layer: ``src_ptrs`` are the device layers (K layers
    then V layers for MHA), ``dst_ptrs`` the host buffers ``[pages, L, page_size, ...]``."""
    per = len(src_ptrs) // max(1, len(dst_ptrs))
    if per * len(dst_ptrs) != len(src_ptrs):
        raise ValueError(f"kvcacheio stand-in: {len(src_ptrs)} device layers do not split over {len(dst_ptrs)} "
                         "host buffers")
    host = [t.reshape(t.shape[0], t.shape[1], page_size, -1) for t in dst_ptrs]
    s_idx = src_indices.reshape(-1)[::page_size].tolist()
    d_idx = dst_indices.reshape(-1)[::page_size].tolist()
    for s, d in zip(s_idx, d_idx):
        for c, h in enumerate(host):
            for layer in range(per):
                h[int(d) // page_size, layer].copy_(_rows(src_ptrs[c * per + layer])[int(s):int(s) + page_size],
                                                   non_blocking=True)
