"""Hugepage-backed host KV pools (feature `hugepages`, seed 322-338): capacity checked first, no silent fallback,
no RAM refusal; always on.

With SGLANG_HUGEPAGE_SIZE=2MB|1GB, 0.5.23 maps the host pool with MAP_HUGETLB but falls back to ordinary pages, only
logging, on an unknown value or a failed mapping, and its RAM check counts MemAvailable, which excludes reserved
hugepages. `capacity` (pure, over a sysfs root) says what a mapping may take: free - reserved of the size, the
free pages of the NUMA nodes a bind policy or cpuset allows, a hugetlb cgroup limit. `hooks` checks before the
mapping and turns every fallback into a startup error (SGLANG_GLM_EXT_HUGEPAGE_FALLBACK=1 keeps upstream's);
`doctor` reports every size per NUMA node and whether a `--hicache-size` launch fits.

Several ranks per node (0.5.23 binds each scheduler to its GPU's NUMA node with `numactl --membind` by default,
SGLANG_NUMA_BIND_V2, so a rank's capacity is its node's free pages). Two checks, neither of which can be fooled by
the order in which ranks allocate:
  1. own need vs usable now, right before each mmap. Pages siblings already took are gone from both sides, so a
     node that fits never refuses its later ranks (a check of "all ranks' need vs free now" would).
  2. ranks x need vs usable at launch: the launcher records the node's usable pages before any rank exists
     (with an explicit --hicache-size it already refuses a node that cannot fit); each rank compares
     ranks_on_node x (what it holds + this need) with that figure, so when the node cannot fit every rank
     refuses at its first pool instead of N-1 passing and the last failing halfway (a plain per-rank check).
Ranks being equal (no pipeline stages) makes (2) exact; with stages it only warns. Between (1) and the mmap
another process can still take pages: the kernel's reservation at mmap time is the atomic arbiter, and its
ENOMEM becomes the same clear error. Pages a NUMA node or cgroup cannot give at fault time (MAP_POPULATE
ignores those, a later touch would SIGBUS) are caught by MADV_POPULATE_WRITE right after the mapping.

`hugepages` is the name the hugepage work shipped with (its patches are `hugepages.*`). It is a folder apart from
`host_register/` (the cudaHostRegister ceiling on the same pool; both were `hostmem/` before): they share
no code, and a hugepage patch that fails after an SGLang upgrade must not mark the ceiling check unavailable (nor
the reverse).
"""
