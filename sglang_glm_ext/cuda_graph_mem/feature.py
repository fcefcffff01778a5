"""cg_mem as users see it: its switch (--log-cuda-graph-buffers, or SGLANG_LOG_CG_BUFFERS=1)."""

from __future__ import annotations

from ..declare import EnvVar, Feature, Flag

LOG_CG_BUFFERS = EnvVar(
    "SGLANG_LOG_CG_BUFFERS", "0",
    "1 = at decode CUDA-graph capture, rank 0 logs static buffers, aliasing and graph-pool growth per shape "
    "(same as --log-cuda-graph-buffers).",
)
LOG_CUDA_GRAPH_BUFFERS = Flag(
    "log_cuda_graph_buffers",
    "At decode CUDA-graph capture, log static buffers, aliasing and graph-pool growth per shape (rank 0).",
    "bool", False, env=LOG_CG_BUFFERS, switch=True,
)

FEATURE = Feature(
    "cg_mem", "CUDA-graph static-buffer and graph-pool memory attribution", "152-162",
    flags=(LOG_CUDA_GRAPH_BUFFERS,), env=(LOG_CG_BUFFERS,), needs_cuda_gpu=True,
)
