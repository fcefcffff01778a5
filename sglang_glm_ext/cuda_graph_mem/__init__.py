"""cg_mem: where decode CUDA-graph memory goes, told at capture time.

Carries seed lines 152-162. With SGLANG_LOG_CG_BUFFERS=1 (or --log-cuda-graph-buffers), rank 0 logs, for each
decode-graph runner family (decode, target_verify, draft, draft_extend): its static buffers (name, shape, dtype,
MiB) with those that share_buffers() aliased onto an earlier family flagged, the graph pool's growth per
captured shape, and a family TOTAL. --enable-profile-cuda-graph writes one cuda_graph_mem_<family>.pickle per
runner instead of every runner overwriting cuda_graph_runner_memory_usage.pickle.

`attribution` is the torch-only core (no SGLang import); `hooks` is the thin patch, declared in `patches.py`;
`feature.py` declares the cg_mem feature (its flag and env var). No doctor part.
"""
