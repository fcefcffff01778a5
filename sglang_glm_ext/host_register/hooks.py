"""BEFORE hook on SGLang's `_cuda_host_register`: refuse at startup a registration past the ceiling.

SGLang 0.5.23 chunks a host buffer only when its pool passes a copy granularity (page-first layouts). The hook
replays SGLang's split with `plan.plan_chunks` and checks it with `plan.check_chunks`: a page-first pool passes
(page-aligned chunks, 256 GiB by default); a layer-first pool above the ceiling gets one clear error naming size,
ceiling and fix, instead of a cryptic cudaErrorMemoryAllocation. The hook never changes what SGLang registers, and
it runs once per host buffer at scheduler start, never on the data path.
"""

from __future__ import annotations

import logging

from .feature import HOST_REGISTER_MAX_GB
from .plan import GIB, HostRegisterPlanError, check_chunks, plan_chunks, refusal_message

logger = logging.getLogger("sglang_glm_ext")


def ceiling_bytes() -> int:
    raw = HOST_REGISTER_MAX_GB.raw() or HOST_REGISTER_MAX_GB.default
    try:
        gb = float(raw)
    except ValueError:
        raise HostRegisterPlanError(f"{HOST_REGISTER_MAX_GB.name}={raw!r}: expected a number of GiB") from None
    if gb <= 0:
        raise HostRegisterPlanError(f"{HOST_REGISTER_MAX_GB.name}={raw!r}: must be positive")
    return int(gb * GIB)


def _sglang_chunk_limit_bytes() -> int:
    from sglang.srt.environ import envs as sglang_envs

    # Same arithmetic as _cuda_host_register (max(env, 1) GiB).
    return max(sglang_envs.SGLANG_HICACHE_HOST_REGISTER_CHUNK_GB.get(), 1) * GIB


def _hicache_layout() -> str | None:
    try:
        from sglang.srt.runtime_context import get_memory

        return get_memory().hicache_mem_layout
    except Exception:  # only used to word the error
        return None


def check_cuda_host_register(buffer, registration_granularity_bytes=None):
    """Raise HostRegisterPlanError when SGLang would register this buffer past the ceiling; else return None."""
    try:
        total = int(buffer.numel()) * int(buffer.element_size())
    except Exception:  # not a tensor we understand: SGLang will judge it
        return None
    ceiling = ceiling_bytes()
    if registration_granularity_bytes is None:
        limit = None
        chunks = plan_chunks(total, None, max(total, 1))
    else:
        limit = _sglang_chunk_limit_bytes()
        if registration_granularity_bytes <= 0 or registration_granularity_bytes > limit:
            return None  # SGLang raises its own clear ValueError for these
        chunks = plan_chunks(total, registration_granularity_bytes, limit)
    try:
        check_chunks(chunks, total, registration_granularity_bytes, ceiling)
    except HostRegisterPlanError:
        raise HostRegisterPlanError(refusal_message(
            total, registration_granularity_bytes, ceiling, env_name=HOST_REGISTER_MAX_GB.name,
            layout=_hicache_layout(), chunk_limit_bytes=limit,
        )) from None
    return None
