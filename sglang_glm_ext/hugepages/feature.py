"""Hugepage-backed host KV pools as users see them (seed 322-338): always on; they check capacity first and never
fall back silently. One env var restores SGLang's fallback."""

from __future__ import annotations

from ..declare import EnvVar, Feature

HUGEPAGE_FALLBACK = EnvVar(
    "SGLANG_GLM_EXT_HUGEPAGE_FALLBACK", "0",
    "1 = keep SGLang's fallback to ordinary pages (logged) when SGLANG_HUGEPAGE_SIZE is unknown, the hugepages do "
    "not suffice, MAP_HUGETLB fails or the host-pool allocator ignores hugepages; the pool is then checked against "
    "RAM as upstream. 0 = each is a clear startup error.",
)

FEATURE = Feature(
    "hugepages", "hugepage-backed host KV pools: capacity check first, no silent fallback, no RAM refusal",
    "322-338", env=(HUGEPAGE_FALLBACK,), always_on=True,
)
