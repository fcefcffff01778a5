"""Pure torch / numpy implementations of the device ops a CPU-served SGLang 0.5.23 calls (the pure core of cpu_serve).

Each function has the keyword signature of the op it stands in for and reproduces its semantics on CPU tensors;
``tests/cpu_serve/test_kernels.py`` checks each one against a reference (SGLang's own Triton kernel run by Triton's
interpreter, SciPy's Hadamard matrix, or a plain loop over the op's documented semantics). Nothing here imports
SGLang. They do NOT validate the CUDA kernels (a GPU node runs those).

* ``sgl_kernel`` names the CPU engine calls: ``copy_all_layer_kv_cache_cpu`` (``cache_move.py``: row moves inside
  every KV buffer), ``assign_req_to_token_pool_cpu`` (``allocation.py``).
* HiCache host<->device copies (``sgl_kernel.kvcacheio``; 0.5.23's host pools bind none on a CPU): direct I/O
  (tensor lists: layer_first, page_first_direct) and kernel I/O (pointer tables: layer_first, page_first) for the
  MHA and MLA pools; the DSA indexer pool uses the MLA ones.
* The DSA indexer's K-cache half: ``hadamard_transform`` (the CUDA fast-hadamard-transform), ``act_quant``
  (SGLang's Triton per-block fp8 quantisation), ``set_k_and_s`` (SGLang's Triton index-K page writer).
"""

from __future__ import annotations

import ctypes

import numpy as np

__all__ = [
    "KVCACHEIO_NAMES", "MLA_KVCACHEIO_NAMES", "copy_all_layer_kv_cache_cpu", "assign_req_to_token_pool_cpu",
    "transfer_kv_direct", "transfer_kv_per_layer_direct_pf_lf", "transfer_kv_all_layer_direct_lf_pf",
    "transfer_kv_per_layer_mla", "transfer_kv_all_layer_mla", "transfer_kv_per_layer_mla_pf_lf",
    "transfer_kv_all_layer_mla_lf_pf", "transfer_kv_per_layer", "transfer_kv_all_layer",
    "transfer_kv_per_layer_pf_lf", "transfer_kv_all_layer_lf_pf", "hadamard_transform", "act_quant", "set_k_and_s",
    "scaled_dummy_init", "perturb_loaded_rows",
]

# The kvcacheio names 0.5.23's host pools call for the layouts and io backends L3 serves (page_head and
# page_unified are MHA-only layouts L3 does not serve; they stay unbound and raise NameError as upstream).
# Direct I/O (tensor lists) and the MLA kernel-I/O ops (pointer tables): what the MLA and DSA indexer pools call.
MLA_KVCACHEIO_NAMES = (
    "transfer_kv_direct",
    "transfer_kv_per_layer_direct_pf_lf",
    "transfer_kv_all_layer_direct_lf_pf",
    "transfer_kv_per_layer_mla",
    "transfer_kv_all_layer_mla",
    "transfer_kv_per_layer_mla_pf_lf",
    "transfer_kv_all_layer_mla_lf_pf",
)
KVCACHEIO_NAMES = MLA_KVCACHEIO_NAMES + (
    "transfer_kv_per_layer",
    "transfer_kv_all_layer",
    "transfer_kv_per_layer_pf_lf",
    "transfer_kv_all_layer_lf_pf",
)


# ---------------------------------------------------------------------------------------------- raw memory views
def _addr_rows(address: int, rows: int, row_bytes: int, stride: int) -> np.ndarray:
    """``rows`` x ``row_bytes`` uint8 view of raw memory at ``address`` with a byte ``stride`` between rows."""
    extent = (rows - 1) * stride + row_bytes
    flat = np.ctypeslib.as_array((ctypes.c_uint8 * extent).from_address(int(address)))
    return np.lib.stride_tricks.as_strided(flat, shape=(rows, row_bytes), strides=(stride, 1))


def _np_index(t) -> np.ndarray:
    return t.detach().cpu().numpy().astype(np.int64, copy=False)


def _tensor_rows(t, row_bytes: int) -> np.ndarray:
    """Writable uint8 (rows, row_bytes) view of a contiguous CPU tensor (a copy would lose the writes)."""
    import torch

    if not t.is_contiguous():
        raise ValueError("kvcacheio stand-in needs a contiguous tensor")
    if t.device.type != "cpu":
        raise ValueError(f"the CPU stand-in got a {t.device.type} tensor")
    return t.view(-1).view(torch.uint8).numpy().reshape(-1, row_bytes)


def _flat_rows(t):
    """(rows, elements-per-row) view of a tensor whose first dim indexes rows."""
    return t.reshape(t.shape[0], -1)


def _paged_view(t):
    """(pages, layers, page_size, row) view of a page_first_direct host buffer ``(pages, L, ps, ...)``."""
    return t.reshape(t.shape[0], t.shape[1], t.shape[2], -1)


# ---------------------------------------------------------------------------------------------- sgl_kernel (CPU engine)
def copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc, src_loc):
    """Move rows ``src_loc`` -> ``tgt_loc`` inside every buffer: buffer ``b`` starts at address ``data_ptrs[b]`` and
    has ``strides[b]`` bytes per row (``cache_move.copy_all_layer_kv_cache_tiled``: all sources are read before any
    target is written)."""
    s, t = _np_index(src_loc), _np_index(tgt_loc)
    if not len(s):
        return
    rows = int(max(s.max(), t.max())) + 1
    for ptr, stride in zip(_np_index(data_ptrs), _np_index(strides), strict=True):
        view = _addr_rows(int(ptr), rows, int(stride), int(stride))
        view[t] = view[s]  # fancy-index read copies first: gather, then scatter


def assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc,
                                 pool_len):
    """``req_to_token[req_pool_indices[i], start[i]:end[i]] = out_cache_loc[sum_{j<i}(end[j]-start[j]) + ...]``
    (``allocation.assign_req_to_token_pool``)."""
    starts, ends, reqs = _np_index(start_offset), _np_index(end_offset), _np_index(req_pool_indices)
    if req_to_token.shape[1] != pool_len:
        raise ValueError(f"pool_len {pool_len} does not match req_to_token's {req_to_token.shape[1]} columns")
    out = 0
    for r, s, e in zip(reqs, starts, ends, strict=True):
        n = int(e - s)
        if n > 0:
            req_to_token[int(r), int(s):int(e)] = out_cache_loc[out:out + n].to(req_to_token.dtype)
        out += max(n, 0)


# ---------------------------------------------------------------------------------------------- kvcacheio: direct I/O
def transfer_kv_direct(src_layers, dst_layers, src_indices, dst_indices, page_size):
    for src, dst in zip(src_layers, dst_layers, strict=True):
        _flat_rows(dst)[dst_indices.long()] = _flat_rows(src)[src_indices.long()]


def transfer_kv_per_layer_direct_pf_lf(src_ptrs, dst_ptrs, src_indices, dst_indices, layer_id, page_size):
    h = src_indices.long()
    d = dst_indices.long()
    for src, dst in zip(src_ptrs, dst_ptrs, strict=True):
        view = _paged_view(src)
        _flat_rows(dst)[d] = view[h // page_size, layer_id, h % page_size]


def transfer_kv_all_layer_direct_lf_pf(src_ptrs, dst_ptrs, src_indices, dst_indices, page_size):
    d = src_indices.long()
    h = dst_indices.long()
    per = len(src_ptrs) // len(dst_ptrs)
    if per * len(dst_ptrs) != len(src_ptrs):
        raise ValueError(f"{len(src_ptrs)} device layers do not split over {len(dst_ptrs)} host buffers")
    for c, dst in enumerate(dst_ptrs):
        view = _paged_view(dst)
        for layer in range(per):
            view[h // page_size, layer, h % page_size] = _flat_rows(src_ptrs[c * per + layer])[d]


# ---------------------------------------------------------------------------------------------- kvcacheio: kernel I/O
def transfer_kv_per_layer_mla(src, dst, src_indices, dst_indices, item_size):
    s, d = _np_index(src_indices), _np_index(dst_indices)
    _tensor_rows(dst, item_size)[d] = _tensor_rows(src, item_size)[s]


def transfer_kv_all_layer_mla(src_layers, dst_layers, src_indices, dst_indices, item_size, num_layers):
    s, d = _np_index(src_indices), _np_index(dst_indices)
    if not len(s):
        return
    for layer in range(num_layers):
        src = _addr_rows(int(src_layers[layer]), int(s.max()) + 1, item_size, item_size)
        dst = _addr_rows(int(dst_layers[layer]), int(d.max()) + 1, item_size, item_size)
        dst[d] = src[s]


def transfer_kv_per_layer_mla_pf_lf(src, dst, src_indices, dst_indices, layer_id, item_size, src_layout_dim):
    s, d = _np_index(src_indices), _np_index(dst_indices)
    if not len(s):
        return
    host = _addr_rows(src.data_ptr() + layer_id * item_size, int(s.max()) + 1, item_size, src_layout_dim)
    _tensor_rows(dst, item_size)[d] = host[s]


def transfer_kv_all_layer_mla_lf_pf(src_layers, dst, src_indices, dst_indices, item_size, dst_layout_dim,
                                    num_layers):
    s, d = _np_index(src_indices), _np_index(dst_indices)
    if not len(s):
        return
    for layer in range(num_layers):
        src = _addr_rows(int(src_layers[layer]), int(s.max()) + 1, item_size, item_size)
        host = _addr_rows(dst.data_ptr() + layer * item_size, int(d.max()) + 1, item_size, dst_layout_dim)
        host[d] = src[s]


# MHA: the same copies for K and for V.
def transfer_kv_per_layer(src_k, dst_k, src_v, dst_v, src_indices, dst_indices, item_size):
    transfer_kv_per_layer_mla(src_k, dst_k, src_indices, dst_indices, item_size)
    transfer_kv_per_layer_mla(src_v, dst_v, src_indices, dst_indices, item_size)


def transfer_kv_all_layer(src_k_layers, dst_k_layers, src_v_layers, dst_v_layers, src_indices, dst_indices,
                          item_size, num_layers):
    transfer_kv_all_layer_mla(src_k_layers, dst_k_layers, src_indices, dst_indices, item_size, num_layers)
    transfer_kv_all_layer_mla(src_v_layers, dst_v_layers, src_indices, dst_indices, item_size, num_layers)


def transfer_kv_per_layer_pf_lf(src_k, dst_k, src_v, dst_v, src_indices, dst_indices, layer_id, item_size,
                                src_layout_dim):
    transfer_kv_per_layer_mla_pf_lf(src_k, dst_k, src_indices, dst_indices, layer_id, item_size, src_layout_dim)
    transfer_kv_per_layer_mla_pf_lf(src_v, dst_v, src_indices, dst_indices, layer_id, item_size, src_layout_dim)


def transfer_kv_all_layer_lf_pf(src_k_layers, dst_k, src_v_layers, dst_v, src_indices, dst_indices, item_size,
                                dst_layout_dim, num_layers):
    transfer_kv_all_layer_mla_lf_pf(src_k_layers, dst_k, src_indices, dst_indices, item_size, dst_layout_dim,
                                    num_layers)
    transfer_kv_all_layer_mla_lf_pf(src_v_layers, dst_v, src_indices, dst_indices, item_size, dst_layout_dim,
                                    num_layers)


# ---------------------------------------------------------------------------------------------- DSA indexer K half
_HADAMARD: dict = {}


def _hadamard_matrix(n: int):
    """Sylvester's Hadamard matrix of order n (a power of 2), the ordering fast-hadamard-transform computes."""
    import torch

    h = _HADAMARD.get(n)
    if h is None:
        if n <= 0 or n & (n - 1):
            raise ValueError(f"Hadamard transform needs a power-of-2 size, got {n}")
        h = torch.ones(1, 1, dtype=torch.float32)
        while h.shape[0] < n:
            h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
        _HADAMARD[n] = h
    return h


def hadamard_transform(x, scale: float = 1.0):
    """``x @ H_n * scale`` over the last axis (fp32 accumulate, result in x's dtype), as the CUDA kernel does."""
    n = x.shape[-1]
    h = _hadamard_matrix(n)
    return ((x.float().reshape(-1, n) @ h) * scale).reshape(x.shape).to(x.dtype)


def act_quant(x, block_size: int = 128, scale_fmt=None):
    """Per-row, per-``block_size`` fp8 e4m3 quantisation (``act_quant_triton.act_quant``): scale = amax/448 with
    amax floored at 1e-4, rounded up to a power of two when ``scale_fmt`` is given; y = clamp(x / scale)."""
    import torch

    if x.shape[-1] % block_size:
        raise ValueError(f"last dimension {x.shape[-1]} is not a multiple of block_size {block_size}")
    n = x.shape[-1]
    blocks = x.float().reshape(-1, n // block_size, block_size)
    amax = blocks.abs().amax(dim=-1).clamp_min(1e-4)
    scale = amax * (1.0 / 448.0)
    if scale_fmt is not None:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    y = (blocks / scale.unsqueeze(-1)).clamp(-448.0, 448.0)
    return (y.reshape(x.shape).to(torch.float8_e4m3fn),
            scale.reshape(*x.shape[:-1], n // block_size).to(torch.float32))


def set_k_and_s(buf, loc, index_k, index_k_scale, page_size: int):
    """Write each token's 128 fp8 index-K bytes and its fp32 scale into the paged index-K buffer
    (``dsa_index_k_cache._set_k_and_s_triton``): a page is ``page_size`` x 128 key bytes, then ``page_size`` x 4
    scale bytes."""
    import torch

    num_pages, per_page = buf.shape
    head = index_k.shape[-1]
    if per_page != page_size * (head + 4):
        raise ValueError(f"index-K page of {per_page} bytes does not hold {page_size} x ({head} + 4)")
    loc = loc.long()
    page, off = loc // page_size, loc % page_size
    keys = buf[:, : page_size * head].view(num_pages, page_size, head)
    keys[page, off] = index_k.contiguous().view(torch.uint8).reshape(-1, head)
    scales = buf[:, page_size * head:].view(num_pages, page_size, 4)
    scales[page, off] = index_k_scale.reshape(-1, 1).contiguous().to(torch.float32).view(torch.uint8).reshape(-1, 4)


# ---------------------------------------------------------------------------------------------- negative control
def _perturb_rows(buf, idx) -> None:
    rows = buf.view(buf.shape[0], -1)
    rows[idx] = (rows[idx].float() * -4.0 + 1.0).to(rows.dtype)


def perturb_loaded_rows(host_pool, layer_id: int, device_indices) -> None:
    """Negate and scale the device rows a HiCache host pool's ``load_to_device_per_layer`` just wrote for
    ``layer_id`` (MLA: its one KV buffer; MHA: K and V), so a comparison of outputs must see wrong reloaded KV (the
    served runs' negative control; test-only). Runs on the caller's stream, after the load it follows."""
    idx = device_indices.long()
    if hasattr(host_pool, "device_kv_buffers") and hasattr(host_pool, "_buffer_index_by_layer"):  # MLA
        if layer_id in host_pool._buffer_index_by_layer:
            _perturb_rows(host_pool.device_kv_buffers[host_pool._buffer_index_by_layer[layer_id]], idx)
    elif hasattr(host_pool, "device_k_buffers"):  # MHA
        _perturb_rows(host_pool.device_k_buffers[layer_id], idx)
        _perturb_rows(host_pool.device_v_buffers[layer_id], idx)


# ---------------------------------------------------------------------------------------------- dummy weights
def scaled_dummy_init(named_params, seed: int = 0) -> int:
    """Deterministic per-parameter weights for a tiny model served with ``--load-format dummy``: each parameter gets
    its own generator (seeded by ``seed`` and a CRC of its name, so every launch of the same model gets the same
    weights), norm weights 1, biases 0, embeddings N(0, 1), other matrices N(0, 1/fan_in) with fan_in the last
    axis. Returns how many parameters it set. Only floating parameters of 16+ bits are touched."""
    import zlib

    import torch

    done = 0
    for name, param in named_params:
        if not torch.is_floating_point(param) or torch.finfo(param.dtype).bits < 16:
            continue
        leaf = name.rsplit(".", 1)[-1]
        with torch.no_grad():
            if leaf == "bias" or "correction_bias" in name:
                param.zero_()
            elif "norm" in name and param.dim() == 1:
                param.fill_(1.0)
            else:
                gen = torch.Generator(device="cpu")
                gen.manual_seed((zlib.crc32(name.encode()) ^ (seed * 0x9E3779B1)) & 0x7FFFFFFF)
                std = 1.0 if "embed" in name else (param.shape[-1] ** -0.5 if param.dim() >= 2 else 0.02)
                values = torch.randn(param.shape, generator=gen, dtype=torch.float32) * std
                param.copy_(values.to(param.dtype))
        done += 1
    return done
