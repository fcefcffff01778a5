"""One host copy and one disk read per node for replicated MLA/DSA KV (feature `host_dedup`, issue 42's first slice).

Under attention TP/CP every rank of a replica set holds the same MLA/DSA KV bytes. With `--hicache-host-dedup on`
the first replica of each node (`plan.py`) keeps the real host pools (KV and DSA indexer) and writes L3; its peers
run SGLang 0.5.23's allocator-only pools (`is_dummy`) in lockstep, skip D2H, read nothing from L3 (the controller's
MIN groups give every rank the source's hit and completion counts) and receive load-back layer by layer through
SGLang's own `MLAHostDedupBroadcaster` (NCCL on CUDA, gloo on a CPU). Design and measurements:
docs_internal/host_dedup.md. Imports nothing.
"""
