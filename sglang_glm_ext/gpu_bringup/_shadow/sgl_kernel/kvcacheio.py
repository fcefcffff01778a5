"""``sgl_kernel.kvcacheio`` of the GPU bring-up stand-in: HiCache host <-> device copies.

SGLang's own host pools call these where its run-time-compiled HiCache kernels do not apply to the pool (always for
GLM-5's DSA indexer pool, ``pool_host/dsa.py`` ~205; for MHA / MLA rows the JIT cannot tile). Each call is handed to
those same JIT kernels (``sglang.kernels.ops.kvcache.hicache``: byte views for one layer, pointer tables for all
layers) when its rows are a multiple of 128 bytes, the register kernel's condition on CUDA, and to the stand-in's
Triton row copy (``gpu_bringup/kernels.py``) otherwise or when the JIT cannot be built (said once, counted in
``FALLBACKS``). ``page_size=1`` goes to the JIT: the stand-in cannot know whether an index names a token or a page
(the indexer pool's items are pages), and only the register kernel copies row by row whatever the indices. Direct I/O
is torch copies, as the real ops are. The page_head layout (MHA only, not served by L3) raises.
"""

from __future__ import annotations

import logging

from sglang_glm_ext.gpu_bringup import kernels as _k

from ._unavailable import unavailable as _unavailable

_log = logging.getLogger("sglang_glm_ext")
USE_JIT = True  # tests and the GPU check switch it to compare both paths against a reference
FALLBACKS: dict = {}  # op -> how many calls took the Triton / torch path after the JIT failed
_TABLES: dict = {}


def note_fallback(op: str, exc: BaseException) -> None:
    if op not in FALLBACKS:
        _log.warning("sglang-glm-ext GPU bring-up: SGLang's JIT kernel for %s failed (%s: %s); the stand-in's own "
                     "copy serves it from now on", op, type(exc).__name__, exc)
    FALLBACKS[op] = FALLBACKS.get(op, 0) + 1


def _jit(item_size: int):
    """SGLang's HiCache JIT module when rows of ``item_size`` bytes take its register kernel, else None."""
    if not USE_JIT or item_size % 128:
        return None
    try:
        from sglang.kernels.ops.kvcache import hicache
    except Exception as exc:  # noqa: BLE001
        note_fallback("kvcacheio", exc)
        return None
    return hicache


def _bytes(t, item_size: int):
    """(rows, item_size) uint8 view of a contiguous buffer whose rows are ``item_size`` bytes."""
    import torch

    return t.view(torch.uint8).view(-1, item_size)


def _layer_of_rows(t, layer_id: int, item_size: int, layout_dim: int):
    """(rows, item_size) uint8 view of layer ``layer_id`` of a page_first buffer (rows ``layout_dim`` bytes apart)."""
    import torch

    flat = t.view(torch.uint8).reshape(-1)
    rows = flat.numel() // layout_dim
    return torch.as_strided(flat, (rows, item_size), (layout_dim, 1), flat.storage_offset() + layer_id * item_size)


def _offset_table(base: int, num_layers: int, step: int, device):
    """Pointer table ``[base + l * step]`` (cached: SGLang reuses its buffers for the pool's life)."""
    import torch

    key = (base, num_layers, step, str(device))
    t = _TABLES.get(key)
    if t is None:
        t = torch.tensor([base + i * step for i in range(num_layers)], dtype=torch.uint64).to(device)  # as SGLang's
        _TABLES[key] = t
    return t


# ---- MLA (one buffer a layer) ------------------------------------------------------------------------------------
def transfer_kv_per_layer_mla(src, dst, src_indices, dst_indices, item_size, block_quota=None,
                              num_warps_per_block=32) -> None:
    h = _jit(item_size)
    if h is not None:
        try:
            return h.transfer_hicache_one_layer_mla(_bytes(dst, item_size), dst_indices, _bytes(src, item_size),
                                                    src_indices, element_dim=item_size, page_size=1)
        except Exception as exc:  # noqa: BLE001
            note_fallback("transfer_kv_per_layer_mla", exc)
    _k.transfer_kv_per_layer_mla(src, dst, src_indices, dst_indices, item_size)


def transfer_kv_per_layer_mla_pf_lf(src, dst, src_indices, dst_indices, layer_id, item_size, src_layout_dim,
                                    block_quota=2, num_warps_per_block=32) -> None:
    h = _jit(item_size)
    if h is not None:
        try:
            return h.transfer_hicache_one_layer_mla(_bytes(dst, item_size), dst_indices,
                                                    _layer_of_rows(src, layer_id, item_size, src_layout_dim),
                                                    src_indices, element_dim=item_size, page_size=1)
        except Exception as exc:  # noqa: BLE001
            note_fallback("transfer_kv_per_layer_mla_pf_lf", exc)
    _k.transfer_kv_per_layer_mla_pf_lf(src, dst, src_indices, dst_indices, layer_id, item_size, src_layout_dim)


def transfer_kv_all_layer_mla(src_layers, dst_layers, src_indices, dst_indices, item_size, num_layers,
                              block_quota=2, num_warps_per_block=32) -> None:
    h = _jit(item_size)
    if h is not None:
        try:
            return h.transfer_hicache_all_layer_mla(dst_layers, dst_indices, src_layers, src_indices,
                                                    cache_src_stride_bytes=item_size,
                                                    cache_dst_stride_bytes=item_size, element_size=item_size,
                                                    page_size=1)
        except Exception as exc:  # noqa: BLE001
            note_fallback("transfer_kv_all_layer_mla", exc)
    _k.transfer_kv_all_layer_mla(src_layers, dst_layers, src_indices, dst_indices, item_size, num_layers)


def transfer_kv_all_layer_mla_lf_pf(src_layers, dst, src_indices, dst_indices, item_size, dst_layout_dim,
                                    num_layers, block_quota=2, num_warps_per_block=32) -> None:
    h = _jit(item_size)
    if h is not None:
        try:
            table = _offset_table(dst.data_ptr(), num_layers, item_size, src_indices.device)
            return h.transfer_hicache_all_layer_mla(table, dst_indices, src_layers, src_indices,
                                                    cache_src_stride_bytes=item_size,
                                                    cache_dst_stride_bytes=dst_layout_dim, element_size=item_size,
                                                    page_size=1)
        except Exception as exc:  # noqa: BLE001
            note_fallback("transfer_kv_all_layer_mla_lf_pf", exc)
    _k.transfer_kv_all_layer_mla_lf_pf(src_layers, dst, src_indices, dst_indices, item_size, dst_layout_dim,
                                       num_layers)


# ---- MHA (K and V) -----------------------------------------------------------------------------------------------
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


# ---- direct I/O (torch copies of runs, as the real ops are) --------------------------------------------------------
transfer_kv_direct = _k.transfer_kv_direct
transfer_kv_per_layer_direct_pf_lf = _k.transfer_kv_per_layer_direct_pf_lf
transfer_kv_all_layer_direct_lf_pf = _k.transfer_kv_all_layer_direct_lf_pf

# ---- imported, not served: MHA's page_head layout (not an L3 layout), MiniMax-M3's embedding cache -----------------
transfer_kv_per_layer_ph_lf = _unavailable("transfer_kv_per_layer_ph_lf")
transfer_kv_all_layer_lf_ph = _unavailable("transfer_kv_all_layer_lf_ph")
transfer_embedding_ranges_direct = _unavailable("transfer_embedding_ranges_direct")
