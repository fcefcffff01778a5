"""Host KV memory: the cudaHostRegister ceiling for host KV pools (seed 297-321), hugepages next.

A single cudaHostRegister over more than ~1 TB fails on B300 (512 GiB works, 1024 GiB does not), and a memcpy whose
host range straddles two registrations fails too, so a pool may only be split where no transfer crosses. SGLang
0.5.23 already registers page-first host pools in page-aligned chunks; a layer-first pool (and any pool whose
layout gives no copy granularity) is still registered in one call. `plan` decides, torch-free, how a buffer is
registered or why it cannot be; `hooks` applies that decision to SGLang's `_cuda_host_register` at startup
(declared in `patches.py`; `feature.py` declares host_register and its ceiling env var). `doctor` reports the
node's hugepages (seed 322-338, whose checks come next).
"""
