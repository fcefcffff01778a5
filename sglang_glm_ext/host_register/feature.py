"""The cudaHostRegister ceiling as users see it: an always-on safety check set by one env var (seed 297-321)."""

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
