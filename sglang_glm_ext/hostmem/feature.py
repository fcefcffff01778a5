"""Host KV memory as users see it: two always-on safety checks, each its own feature row.

`host_register` (seed 297-321): the cudaHostRegister ceiling, set by one env var. `hugepages` (seed 322-338):
hugepage-backed host pools check capacity first and never fall back silently; one env var restores SGLang's
fallback. They are separate records because each has its own env var, patches and availability (a hugepage patch
that fails to land must not mark the ceiling check unavailable); the `__init__` docstring says why one folder.
"""

from __future__ import annotations

from ..declare import EnvVar, Feature

HOST_REGISTER_MAX_GB = EnvVar(
    "SGLANG_GLM_EXT_HOST_REGISTER_MAX_GB", "480",
    "Largest single cudaHostRegister the plugin allows (GiB); B300 fails at 1024 GiB, 512 GiB works.",
)

FEATURE = Feature(
    "host_register", "cudaHostRegister ceiling check for host KV pools", "297-321",
    env=(HOST_REGISTER_MAX_GB,), always_on=True,
)

HUGEPAGE_FALLBACK = EnvVar(
    "SGLANG_GLM_EXT_HUGEPAGE_FALLBACK", "0",
    "1 = keep SGLang's fallback to ordinary pages (logged) when SGLANG_HUGEPAGE_SIZE is unknown, the hugepages do "
    "not suffice, MAP_HUGETLB fails or the host-pool allocator ignores hugepages; the pool is then checked against "
    "RAM as upstream. 0 = each is a clear startup error.",
)

HUGEPAGES = Feature(
    "hugepages", "hugepage-backed host KV pools: capacity check first, no silent fallback, no RAM refusal",
    "322-338", env=(HUGEPAGE_FALLBACK,), always_on=True,
)
