"""Registration planning for host KV pools: pure arithmetic, no torch, no SGLang.

`plan_chunks` reproduces how SGLang 0.5.23 splits one host buffer into cudaHostRegister calls
(mem_cache/pool_host/common.py `_cuda_host_register`): no granularity -> one call for the whole buffer; with a
granularity -> chunks of floor(limit / granularity) * granularity bytes. `check_chunks` states the invariant the
fork needed (seed 297-321) and raises with the numbers and the fix when a plan breaks it:

1. no single registration exceeds the ceiling (B300: 512 GiB works, 1024 GiB fails), and
2. every chunk boundary is a multiple of the layout's transfer unit, so no host<->device copy straddles two
   registrations (a cudaMemcpyBatchAsync across a boundary fails with cudaErrorInvalidValue).

Transfer units by host layout (SGLang 0.5.23 pool_host/*):
- page_first (size, L, ...) and page_first_direct (pages, L, page, ...): one page across all layers is contiguous
  and is what a page copy addresses; SGLang passes `page_size * layout_dim` as the granularity.
- layer_first (L, size, ...): a page's per-layer slices lie a whole layer apart, and a per-layer direct copy may
  merge a run of consecutive pages of one layer into a single memcpy. The only boundary no layer-first copy can
  cross is a layer boundary, so its unit is a whole layer slab (`layer_first_unit`). SGLang passes no granularity.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3


class HostRegisterPlanError(RuntimeError):
    """A registration plan would exceed the ceiling or split a transfer unit."""


@dataclass(frozen=True)
class Chunk:
    offset: int
    size: int


def page_first_unit(page_size: int, layers: int, token_bytes_per_layer: int) -> int:
    """One page, all layers: the granularity SGLang passes for page_first / page_first_direct pools."""
    return page_size * layers * token_bytes_per_layer


def layer_first_unit(host_tokens: int, token_bytes_per_layer: int) -> int:
    """One layer slab of a layer-first pool: the smallest range no layer-first copy can cross."""
    return host_tokens * token_bytes_per_layer


def plan_chunks(total_bytes: int, unit_bytes: int | None, limit_bytes: int) -> tuple[Chunk, ...]:
    """SGLang's split: the whole buffer when no unit is known, else whole units up to `limit_bytes` per chunk."""
    if total_bytes < 0 or limit_bytes <= 0:
        raise ValueError(f"bad sizes: total={total_bytes} limit={limit_bytes}")
    if total_bytes == 0:
        return ()
    if unit_bytes is None:
        return (Chunk(0, total_bytes),)
    if unit_bytes <= 0:
        raise ValueError(f"transfer unit must be positive, got {unit_bytes}")
    if unit_bytes > limit_bytes:
        raise HostRegisterPlanError(f"one transfer unit ({_gib(unit_bytes)}) exceeds the chunk limit {_gib(limit_bytes)}")
    per_chunk = (limit_bytes // unit_bytes) * unit_bytes
    return tuple(Chunk(off, min(per_chunk, total_bytes - off)) for off in range(0, total_bytes, per_chunk))


def check_chunks(chunks: tuple[Chunk, ...], total_bytes: int, unit_bytes: int | None, ceiling_bytes: int) -> None:
    """AssertionError-free invariant check: raises HostRegisterPlanError naming the first violation."""
    pos = 0
    for c in chunks:
        if c.offset != pos or c.size <= 0:
            raise HostRegisterPlanError(f"chunks do not tile the buffer at offset {pos}: {c}")
        if c.size > ceiling_bytes:
            raise HostRegisterPlanError(f"chunk at {c.offset} is {_gib(c.size)} > ceiling {_gib(ceiling_bytes)}")
        if pos and (unit_bytes is None or pos % unit_bytes):
            raise HostRegisterPlanError(f"boundary at byte {pos} splits a transfer unit of {unit_bytes} bytes")
        pos += c.size
    if pos != total_bytes:
        raise HostRegisterPlanError(f"chunks cover {pos} of {total_bytes} bytes")


def plan_within_ceiling(total_bytes: int, unit_bytes: int | None, ceiling_bytes: int) -> tuple[Chunk, ...]:
    """The plan the plugin would register: SGLang's split with the ceiling as the chunk limit, checked."""
    chunks = plan_chunks(total_bytes, unit_bytes, ceiling_bytes)
    check_chunks(chunks, total_bytes, unit_bytes, ceiling_bytes)
    return chunks


def refusal_message(total_bytes: int, unit_bytes: int | None, ceiling_bytes: int, *, env_name: str,
                    layout: str | None, chunk_limit_bytes: int | None) -> str:
    """The startup error for a buffer SGLang would register past the ceiling; names size, ceiling and fix."""
    if unit_bytes is None:
        why = (
            f"SGLang registers it in ONE cudaHostRegister call (host layout {layout or 'unknown'} gives SGLang no "
            "copy granularity, so it is not chunked)"
        )
        fix = (
            "use --hicache-mem-layout page_first (or page_first_direct), which SGLang registers in page-aligned "
            f"chunks, or lower --hicache-size / --hicache-ratio so each host buffer is at most {_gib(ceiling_bytes)}"
        )
    else:
        why = f"SGLang's chunk size ({_gib(chunk_limit_bytes or 0)}, SGLANG_HICACHE_HOST_REGISTER_CHUNK_GB) is above it"
        fix = f"set SGLANG_HICACHE_HOST_REGISTER_CHUNK_GB to at most {int(ceiling_bytes // GIB)}"
    return (
        f"sglang-glm-ext: a HiCache host buffer of {_gib(total_bytes)} would exceed the single-cudaHostRegister "
        f"ceiling of {_gib(ceiling_bytes)} ({env_name}; B300 fails at ~1 TB in one call): {why}. Fix: {fix}. Raise "
        f"{env_name} only if this GPU and driver are known to register more in one call."
    )


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"
