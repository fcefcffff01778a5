"""The SGLang side of the CPU serving mode (patches declared in ``cpu_serve/patches.py``).

Two kinds of hook:

* the launch check (``Tier.FEATURE``, in every launching process): with ``SGLANG_GLM_EXT_CPU_SERVE=1`` a launch
  without ``--device cpu`` stops with one line (the accelerator / real ``sgl_kernel`` / ``SGLANG_USE_CPU_ENGINE``
  checks run earlier, in the feature's ``validate``, from the plugin's own server-args hook);
* the stand-ins (``Tier.CPU_SERVE``): applied by ``register()`` only when the mode is on and ``gate.activate()``
  passed, so on a GPU node (mode off, or refused) none is ever in SGLang's code. Each still asks :func:`_on` at
  call time and otherwise runs SGLang's own code.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import logging
import sys
from typing import Callable

from ..declare import PluginFlagError
from . import gate, kernels

logger = logging.getLogger("sglang_glm_ext")

__all__ = ["hook_from_cli_args", "hook_resolve_once", "bind_sgl_kernel_names", "bind_kvcacheio",
           "hook_unpinned_host_pool", "hook_model_adjustments", "hook_get_handler", "indexer_forward_native",
           "hook_set_k_and_s", "hook_perturb_loads", "hook_dummy_weights", "hook_cpu_streams"]


def _on() -> bool:
    return gate.mode_on() and gate.standin_reachable()


# ---------------------------------------------------------------------------------------------- launch check
def check_launch(server_args) -> None:
    """PluginFlagError (one line) when the mode is on and this launch is not ``--device cpu``."""
    if not gate.mode_on():
        return
    why = gate.device_refusal(getattr(server_args, "device", None))
    if why:
        raise PluginFlagError(f"SGLANG_GLM_EXT_CPU_SERVE=1 refused: {why}")


def hook_from_cli_args(server_args, cls, ns, *args, **kwargs):
    """AFTER ServerArgs.from_cli_args: a command-line user gets one line, not a traceback."""
    try:
        check_launch(server_args)
    except PluginFlagError as exc:
        raise SystemExit(f"sglang-glm-ext: {exc}") from None
    return server_args


def hook_resolve_once(self, *args, **kwargs):
    """BEFORE ServerArgs.resolve_once: the same check for Engine(...) and any other way a record is built."""
    if not getattr(self, "_resolution_finished", False):
        check_launch(self)
    return None


# ---------------------------------------------------------------------------------------------- sgl_kernel names
def bind_sgl_kernel_names(target: str, names: tuple[str, ...]) -> None:
    """Import ``target`` (its ``from sgl_kernel import ...`` then reaches the stand-in through ``sys.path``) and
    check that each name it holds is the stand-in's own object, not some other sgl_kernel's."""
    module = importlib.import_module(target)
    standin = sys.modules.get(gate.STANDIN_MODULE)
    if standin is None or not getattr(standin, "GLM_EXT_CPU_STANDIN", False):
        raise RuntimeError(f"{target} imported, but sgl_kernel is not the CPU stand-in "
                           f"({getattr(standin, '__file__', 'not imported')})")
    for name in names:
        if getattr(module, name, None) is not getattr(standin, name):
            raise RuntimeError(f"{target}.{name} is not the stand-in's {name}")


# ---------------------------------------------------------------------------------------------- HiCache copies
def bind_kvcacheio(target: str, names: tuple[str, ...]) -> None:
    """Bind the torch copies (``kernels.py``) into a host-pool module for every kvcacheio name it left unbound
    (0.5.23 imports them only under ``_is_cuda or _is_hip`` / ``_is_xpu``). A name already bound is left alone."""
    module = importlib.import_module(target)
    for name in names:
        if getattr(module, name, None) is None:
            setattr(module, name, getattr(kernels, name))


@functools.lru_cache(maxsize=None)
def _signature(fn: Callable) -> inspect.Signature:
    return inspect.signature(fn)


def hook_unpinned_host_pool(original, self, *args, **kwargs):
    """AROUND a host pool's __init__: ``pin_memory=False`` (pinning calls cudaHostRegister, which needs a driver)."""
    if not _on():
        return original(self, *args, **kwargs)
    bound = _signature(original).bind(self, *args, **kwargs)
    bound.arguments["pin_memory"] = False
    return original(*bound.args, **bound.kwargs)


# ---------------------------------------------------------------------------------------------- argument resolution
@contextlib.contextmanager
def _no_cuda_capability():
    """``torch.cuda.get_device_capability()`` answers (0, 0) (no CUDA architecture) while no CUDA device exists;
    SGLang's DSA argument resolution calls it unguarded (overrides.py ~512, ~581, ~631; model_hook.py ~341)."""
    import torch

    if torch.cuda.is_available():
        yield
        return
    previous = torch.cuda.get_device_capability
    torch.cuda.get_device_capability = lambda device=None: (0, 0)
    try:
        yield
    finally:
        torch.cuda.get_device_capability = previous


def hook_model_adjustments(original, *args, **kwargs):
    """AROUND model_hook.handle_model_specific_adjustments (where the DSA resolution passes run)."""
    if not _on():
        return original(*args, **kwargs)
    with _no_cuda_capability():
        return original(*args, **kwargs)


# ---------------------------------------------------------------------------------------------- MLA dispatch
def _torch_native_mla(attn, forward_batch):
    from sglang.srt.models.deepseek_common.attention_backend_handler import _dispatch_mla_subtype

    return _dispatch_mla_subtype(attn, forward_batch)


def hook_get_handler(original, cls, backend_name):
    """AROUND AttentionBackendRegistry.get_handler: torch_native has no handler, so SGLang's default (triton's)
    picks MHA for a prefix-free prefill, which reads the MLA pool as MHA. On CPU, route torch_native to SGLang's
    own ``_dispatch_mla_subtype`` (absorbed MLA for prefill and decode)."""
    if backend_name == "torch_native" and _on():
        return _torch_native_mla
    return original(cls, backend_name)


# ---------------------------------------------------------------------------------------------- DSA indexer
def indexer_k(indexer, x, positions):
    """The indexer key as ``Indexer._get_k_bf16`` computes it (wk -> k_norm -> RoPE on the first rope_head_dim
    -> Hadamard), with the rotary given a head axis (the CPU rope broadcasts over heads) and the Hadamard in torch."""
    import torch

    key, _ = indexer.wk(x)
    key = indexer.k_norm(key)
    rope = indexer.rope_head_dim
    k_rope = key[..., :rope].unsqueeze(1)
    _, k_rot = indexer.rotary_emb(positions, k_rope.clone(), k_rope.clone())
    key = torch.cat([k_rot.reshape(key.shape[0], rope).to(key.dtype), key[..., rope:]], dim=-1)
    return kernels.hadamard_transform(key, scale=key.shape[-1] ** -0.5)


def indexer_forward_native(self, x, q_lora, positions, forward_batch, layer_id, return_indices=True, *args,
                           **kwargs):
    """REPLACE Indexer.forward_native (0.5.23: "no native path"): the K-cache half only. Writes each new token's
    fp8 index key and scale into the index-K cache through SGLang's own ``_store_index_k_cache`` (with the torch
    ``act_quant``), then returns None, as the CUDA path does when the attention backend gives no indexer metadata
    (torch_native gives none): attention runs dense. The indexer's top-k (sparse attention) is not computed."""
    if isinstance(x, tuple) or forward_batch.out_cache_loc is None or forward_batch.out_cache_loc.numel() == 0:
        return None
    key = indexer_k(self, x, positions)
    self._store_index_k_cache(forward_batch=forward_batch, layer_id=layer_id, key=key.contiguous(),
                              act_quant=kernels.act_quant)
    return None


def hook_set_k_and_s(original, cls, *args, buf, **kwargs):
    """AROUND SetKAndS.execute: a CPU index-K buffer is written by the torch ``set_k_and_s`` (the Triton kernel
    needs a GPU)."""
    if buf.device.type != "cpu" or not _on():
        return original(cls, *args, buf=buf, **kwargs)
    pool = kwargs["pool"] if "pool" in kwargs else args[0]
    kernels.set_k_and_s(buf, kwargs["loc"], kwargs["index_k"], kwargs["index_k_scale"], pool.index_page_size)
    return None


# ---------------------------------------------------------------------------------------------- negative control
def hook_perturb_loads(original, self, device_pool, host_indices, device_indices, layer_id, io_backend, *args,
                       **kwargs):
    """AROUND a host pool's load_to_device_per_layer: with SGLANG_GLM_EXT_CPU_SERVE_PERTURB_LOADS=1 (test-only),
    the device rows just loaded are negated and scaled, so the main job's comparison must catch wrong reloaded KV."""
    result = original(self, device_pool, host_indices, device_indices, layer_id, io_backend, *args, **kwargs)
    from .feature import PERTURB_LOADS

    if not (_on() and PERTURB_LOADS.get_bool()) or device_indices is None or device_indices.numel() == 0:
        return result
    kernels.perturb_loaded_rows(self, layer_id, device_indices)
    return result


# ---------------------------------------------------------------------------------------------- dummy weights
def hook_dummy_weights(result, model, *args, **kwargs):
    """AFTER weight_utils.initialize_dummy_weights: for a model directory written by `sglang-glm-ext tiny-model`
    (its marker file), give each parameter seeded, fan-in-scaled values (kernels.scaled_dummy_init), so the tiny
    model's greedy output depends on the prompt; any other model keeps SGLang's dummy weights."""
    if not _on():
        return result
    from ..declare import published_server_args
    from .tiny_model import scaled_dummy_seed

    record = published_server_args()
    seed = scaled_dummy_seed(getattr(record, "model_path", None))
    if seed is not None:
        n = kernels.scaled_dummy_init(model.state_dict().items(), seed)
        logger.info("sglang-glm-ext cpu_serve: scaled dummy weights for the tiny model (%d parameters, seed %d)",
                    n, seed)
    return result


# ---------------------------------------------------------------------------------------------- streams
_SYNC_STREAM_CLASSES: dict = {}


def _synchronizing(stream):
    """The same CPU stream object's class with a no-op ``synchronize`` (work on a CPU "stream" already ran)."""
    base = type(stream)
    cls = _SYNC_STREAM_CLASSES.get(base)
    if cls is None:
        cls = type(f"{base.__name__}WithSynchronize", (base,), {
            "__doc__": "torch.cpu.Stream plus synchronize(): CPU work is synchronous (sglang-glm-ext cpu_serve).",
            "synchronize": lambda self: None,
        })
        _SYNC_STREAM_CLASSES[base] = cls
    stream.__class__ = cls
    return stream


def hook_cpu_streams(result, self, *args, **kwargs):
    """AFTER L2TransferEngine.__init__: torch.cpu.Stream has no ``synchronize``, which the transfer error path
    calls (l2_transfer.py ~123); there the AttributeError would hide the real error. Give the CPU streams one."""
    if not _on():
        return result
    for name in ("device_to_host_stream", "host_to_device_stream"):
        stream = getattr(self, name, None)
        if stream is not None and not hasattr(stream, "synchronize"):
            _synchronizing(stream)
    return result
