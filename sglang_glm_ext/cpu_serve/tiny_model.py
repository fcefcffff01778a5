"""`sglang-glm-ext tiny-model --arch glm4_moe|glm5 DIR`: a GLM model directory that needs no hub.

It writes `config.json` (the real architecture names SGLang dispatches on: `Glm4MoeForCausalLM` /
`GlmMoeDsaForCausalLM`), a byte-level tokenizer (`tokenizer.json` + `tokenizer_config.json`, saved by
`transformers.PreTrainedTokenizerFast`, so any text tokenizes without unknown tokens and every id below
`vocab_size` decodes) and a GLM-style chat template. There are no weights: serve it with SGLang's
`--load-format dummy` (random weights, the same on every launch of the same config, so greedy outputs repeat
across restarts).

The GLM-5 shape follows what SGLang 0.5.23 can run on a CPU (``docs_internal/cpu_serve.md``): MLA with
`kv_lora_rank` 64, the DSA indexer with `index_head_dim` 128 (the index-K cache page layout needs 128),
`rope_scaling` of type `deepseek_yarn` with factor 1.0 (the CPU rope accepts only that type; factor 1.0 is plain
RoPE), no NextN layer. `--hidden` / `--layers` / `--experts` scale it (the server benchmark uses a bigger one, so
that a prefill costs more than a disk read).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

ARCHES = ("glm4_moe", "glm5")
# Written into the model directory. With it, the CPU serving mode's dummy-weight init (cpu_serve.dummy_weights)
# gives each parameter its own seeded, fan-in-scaled values instead of SGLang's one-seed uniform +-1e-3: with
# SGLang's values a tiny model's greedy output does not depend on the prompt (every reply is the same tokens), so
# comparing outputs across restarts would prove nothing.
MARKER = "sglang_glm_ext_tiny_model.json"
VOCAB_SIZE = 512
# GLM's chat markers; the template below is GLM-4's shape ([gMASK]<sop><|role|>\ncontent...).
SPECIAL_TOKENS = ("<|endoftext|>", "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>")
EOS = "<|endoftext|>"
CHAT_TEMPLATE = (
    "[gMASK]<sop>"
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


class TinyModelError(ValueError):
    """Bad arguments for the generator (unknown arch, a shape SGLang cannot serve, a non-empty target)."""


# glm5's MLA head geometry. "tiny": small latent and head sizes, what the CPU serving mode needs. "glm5": GLM-5's own
# (kv_lora_rank 512, rope 64, nope 192, v 256; KV rows of 576 values), what SGLang's Triton MLA kernels on a GPU are
# written for: with a 64-wide latent their extend kernel does not compile (its P*V dot meets a 128-wide V block).
MLA_GEOMETRY = {"tiny": {"kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 32, "v_head_dim": 32},
                "glm5": {"kv_lora_rank": 512, "qk_nope_head_dim": 192, "qk_rope_head_dim": 64, "v_head_dim": 256}}


def config(arch: str, *, hidden: int | None = None, layers: int = 2, experts: int = 4,
           mla: str = "tiny", context: int = 8192) -> dict[str, Any]:
    """The `config.json` for `arch` (see the module docstring for why each value); `mla`: glm5's MLA_GEOMETRY;
    `context`: max_position_embeddings, SGLang's context length (one token per byte: a prompt of N bytes needs N)."""
    if arch not in ARCHES:
        raise TinyModelError(f"unknown --arch {arch!r}; choose one of {', '.join(ARCHES)}")
    if mla not in MLA_GEOMETRY:
        raise TinyModelError(f"unknown --mla {mla!r}; choose one of {', '.join(MLA_GEOMETRY)}")
    if context < 1024:
        raise TinyModelError("--context must be at least 1024 tokens")
    if layers < 2:
        raise TinyModelError("--layers must be at least 2 (one dense layer, then MoE layers)")
    if experts < 2:
        raise TinyModelError("--experts must be at least 2 (top-2 routing)")
    common = {
        "vocab_size": VOCAB_SIZE, "num_hidden_layers": layers, "first_k_dense_replace": 1,
        "n_routed_experts": experts, "num_experts_per_tok": 2, "n_shared_experts": 1, "n_group": 1,
        "topk_group": 1, "norm_topk_prob": True, "routed_scaling_factor": 1.0, "hidden_act": "silu",
        "rms_norm_eps": 1e-5, "max_position_embeddings": context, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "bos_token_id": None, "eos_token_id": SPECIAL_TOKENS.index(EOS) + 256,
        "pad_token_id": SPECIAL_TOKENS.index(EOS) + 256, "attention_bias": False, "initializer_range": 0.02,
        "use_cache": True,
    }
    if arch == "glm4_moe":
        h = hidden or 64
        if h % 16:
            raise TinyModelError("--hidden must be a multiple of 16 for glm4_moe (head_dim 16)")
        heads = h // 16
        return {**common, "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe",
                "hidden_size": h, "intermediate_size": 2 * h, "moe_intermediate_size": h,
                "num_attention_heads": heads, "num_key_value_heads": max(1, heads // 2), "head_dim": 16,
                "partial_rotary_factor": 0.5, "rope_theta": 10000.0, "use_qk_norm": False,
                "topk_method": "noaux_tc", "scoring_func": "sigmoid"}
    h = hidden or 128
    if h % 32:
        raise TinyModelError("--hidden must be a multiple of 32 for glm5")
    heads = max(1, h // 32)
    return {**common, "architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa",
            "hidden_size": h, "intermediate_size": 2 * h, "moe_intermediate_size": h,
            "num_attention_heads": heads, "num_key_value_heads": heads,
            "q_lora_rank": 64, **MLA_GEOMETRY[mla], "index_topk": 64, "index_head_dim": 128, "index_n_heads": 4,
            "topk_method": "noaux_tc", "scoring_func": "sigmoid", "rope_theta": 10000.0,
            "rope_scaling": {"type": "deepseek_yarn", "rope_type": "deepseek_yarn", "factor": 1.0,
                             "original_max_position_embeddings": context, "beta_fast": 32, "beta_slow": 1,
                             "mscale": 1.0, "mscale_all_dim": 1.0},
            "moe_layer_freq": 1, "num_nextn_predict_layers": 0}


def _byte_level_vocab() -> dict[str, int]:
    """The 256 byte-level symbols (ids 0-255), the GLM specials (256-262), then filler two-symbol tokens up to
    VOCAB_SIZE, so that every id a random-weight model emits decodes to text."""
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = sorted(ByteLevel.alphabet())
    vocab = {s: i for i, s in enumerate(alphabet)}
    for tok in SPECIAL_TOKENS:
        vocab[tok] = len(vocab)
    for a in alphabet:
        for b in alphabet:
            if len(vocab) >= VOCAB_SIZE:
                return vocab
            vocab.setdefault(a + b, len(vocab))
    return vocab


def tokenizer():
    """A byte-level `PreTrainedTokenizerFast` (no merges: one token per byte) with GLM's specials."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(vocab=_byte_level_vocab(), merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS,
                                   additional_special_tokens=[t for t in SPECIAL_TOKENS if t != EOS])
    fast.chat_template = CHAT_TEMPLATE
    return fast


def write(arch: str, directory: str, *, hidden: int | None = None, layers: int = 2, experts: int = 4,
          force: bool = False, scaled_dummy: bool = True, seed: int = 0, mla: str = "tiny",
          context: int = 8192) -> dict[str, Any]:
    """Write the model directory; returns its config. Refuses a directory that holds files unless `force`.
    `scaled_dummy`: write MARKER, so the CPU serving mode initialises `--load-format dummy` weights per parameter
    (seeded by `seed` and the parameter's name) at a scale whose output depends on the prompt."""
    cfg = config(arch, hidden=hidden, layers=layers, experts=experts, mla=mla, context=context)
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise TinyModelError(f"{directory}: exists and is not a directory")
    if os.path.isdir(directory) and os.listdir(directory) and not force:
        raise TinyModelError(f"{directory}: not empty (pass --force to overwrite the model files in it)")
    os.makedirs(directory, exist_ok=True)
    tok = tokenizer()
    tok.save_pretrained(directory)
    with open(os.path.join(directory, "chat_template.jinja"), "w") as f:
        f.write(CHAT_TEMPLATE)
    with open(os.path.join(directory, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": cfg["eos_token_id"], "pad_token_id": cfg["pad_token_id"]}, f, indent=2)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    marker = os.path.join(directory, MARKER)
    if scaled_dummy:
        with open(marker, "w") as f:
            json.dump({"generator": "sglang-glm-ext tiny-model", "arch": arch, "dummy_init": "scaled",
                       "seed": seed}, f, indent=2)
    elif os.path.exists(marker):
        os.remove(marker)
    return cfg


def scaled_dummy_seed(model_path: str | None) -> int | None:
    """The seed of a tiny model directory that asks for scaled dummy weights; None otherwise (SGLang's own init)."""
    if not model_path:
        return None
    try:
        with open(os.path.join(model_path, MARKER)) as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("dummy_init") != "scaled":
        return None
    seed = meta.get("seed", 0)
    return seed if isinstance(seed, int) else 0


def add_subcommand(sub) -> None:
    p = sub.add_parser("tiny-model", help="write a tiny GLM model directory (config, tokenizer, chat template) "
                       "that SGLang serves with --load-format dummy; no hub needed")
    p.add_argument("--arch", choices=ARCHES, required=True,
                   help="glm4_moe: Glm4MoeForCausalLM (MHA); glm5: GlmMoeDsaForCausalLM (MLA + DSA indexer)")
    p.add_argument("dir", help="the model directory to write")
    p.add_argument("--hidden", type=int, default=None, help="hidden size (64 for glm4_moe, 128 for glm5 when not given)")
    p.add_argument("--layers", type=int, default=2, help="decoder layers (2: one dense, one MoE)")
    p.add_argument("--experts", type=int, default=4, help="routed experts (top-2)")
    p.add_argument("--mla", choices=tuple(MLA_GEOMETRY), default="tiny",
                   help="glm5's MLA head geometry: tiny (CPU serving) or glm5 (GLM-5's own, for SGLang's GPU kernels)")
    p.add_argument("--context", type=int, default=8192,
                   help="context length in tokens (max_position_embeddings; one token per byte of prompt)")
    p.add_argument("--force", action="store_true", help="write into a non-empty directory")
    p.add_argument("--plain-dummy", action="store_true",
                   help="leave SGLang's own dummy weights (uniform +-1e-3, one seed): the output then does not depend "
                        "on the prompt")
    p.set_defaults(func=_run)


def _run(args) -> int:
    try:
        cfg = write(args.arch, args.dir, hidden=args.hidden, layers=args.layers, experts=args.experts,
                    force=args.force, scaled_dummy=not args.plain_dummy, mla=args.mla, context=args.context)
    except TinyModelError as exc:
        print(f"sglang-glm-ext tiny-model: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {cfg['architectures'][0]} (hidden {cfg['hidden_size']}, {cfg['num_hidden_layers']} layers, "
          f"vocab {cfg['vocab_size']}) to {args.dir}; serve it with --load-format dummy")
    return 0
