"""The cudaHostRegister ceiling for host KV pools (feature `host_register`, seed 297-321); always on.

A single cudaHostRegister over more than ~1 TB fails on B300 (512 GiB works, 1024 GiB does not), and a memcpy
whose host range straddles two registrations fails too, so a pool may only be split where no transfer crosses.
SGLang 0.5.23 already registers page-first host pools in page-aligned chunks; a layer-first pool (and any pool
whose layout gives no copy granularity) is still registered in one call. `plan` (pure, torch-free) decides how a
buffer is registered or why it cannot be; `hooks` applies that decision to SGLang's `_cuda_host_register` and
refuses at startup a registration past the ceiling (SGLANG_GLM_EXT_HOST_REGISTER_MAX_GB). It never changes what
SGLang registers. Its sibling `hugepages/` guards the same host pool's memory from the other side (where the pages
come from); the two are separate features because each has its own env var, patches and availability.
"""
