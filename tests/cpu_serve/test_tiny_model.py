"""`sglang-glm-ext tiny-model`: a model directory SGLang accepts, without a hub. The CLI runs in a process of its
own, forked from a parent that imported SGLang only (the ``sglang_python`` fixture)."""

import json
import os

import pytest

from sglang_glm_ext.cpu_serve import tiny_model


@pytest.mark.slow
@pytest.mark.parametrize("arch,cls", [("glm5", "GlmMoeDsaForCausalLM"), ("glm4_moe", "Glm4MoeForCausalLM")])
def test_cli_writes_config_tokenizer_and_chat_template(sglang_python, tmp_path, arch, cls):
    d = tmp_path / arch
    proc = sglang_python.run(module="sglang_glm_ext.cli", argv=["tiny-model", "--arch", arch, d],
                             env=dict(os.environ), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["architectures"] == [cls] and cfg["vocab_size"] == tiny_model.VOCAB_SIZE
    assert (d / "chat_template.jinja").is_file() and (d / tiny_model.MARKER).is_file()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(d))
    assert len(tok) == cfg["vocab_size"]  # every id a random model emits decodes
    ids = tok.apply_chat_template([{"role": "system", "content": "héllo"}, {"role": "user", "content": "hi"}],
                                  add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    text = tok.decode(ids)
    assert text == "[gMASK]<sop><|system|>\nhéllo<|user|>\nhi<|assistant|>\n"
    assert tok.eos_token_id == cfg["eos_token_id"]
    tok.decode(list(range(cfg["vocab_size"])))


@pytest.mark.parametrize("mla, latent, row", [("tiny", 64, 96), ("glm5", 512, 576)])
def test_sglangs_model_config_accepts_the_glm5_directory(tmp_path, mla, latent, row):
    d = tmp_path / "m"
    tiny_model.write("glm5", str(d), mla=mla)
    from sglang.srt.configs.model_config import is_glm_moe_dsa
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(str(d))
    assert is_glm_moe_dsa(hf)
    assert hf.index_head_dim == 128 and hf.kv_lora_rank == latent and hf.num_nextn_predict_layers == 0
    assert hf.kv_lora_rank + hf.qk_rope_head_dim == row  # the values of one MLA KV row (GLM-5: 576)


@pytest.mark.parametrize("arch", ["glm4_moe", "glm5"])
def test_the_context_length_is_what_sglang_serves(tmp_path, arch):
    """A prompt of N bytes is N tokens: the bench's 16,000-character prompts need a context past 8,192 (on the H200
    SGLang refused them with HTTP 400 at the default)."""
    from sglang.srt.configs.model_config import ModelConfig

    tiny_model.write(arch, str(tmp_path / "m"), context=20480)
    assert ModelConfig(str(tmp_path / "m")).context_len == 20480


@pytest.mark.slow
def test_bad_arguments_are_clear_errors(sglang_python, tmp_path):
    with pytest.raises(tiny_model.TinyModelError, match="unknown --arch"):
        tiny_model.config("glm9")
    with pytest.raises(tiny_model.TinyModelError, match="multiple of 32"):
        tiny_model.config("glm5", hidden=100)
    with pytest.raises(tiny_model.TinyModelError, match="unknown --mla 'big'"):
        tiny_model.config("glm5", mla="big")
    with pytest.raises(tiny_model.TinyModelError, match="--context must be at least 1024"):
        tiny_model.config("glm4_moe", context=100)
    with pytest.raises(tiny_model.TinyModelError, match="at least 2"):
        tiny_model.config("glm4_moe", layers=1)
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "keep.txt").write_text("mine")
    with pytest.raises(tiny_model.TinyModelError, match="not empty"):
        tiny_model.write("glm5", str(tmp_path / "x"))
    proc = sglang_python.run(module="sglang_glm_ext.cli", argv=["tiny-model", "--arch", "glm5", tmp_path / "x"],
                             env=dict(os.environ), timeout=300)
    assert proc.returncode == 2 and "not empty" in proc.stderr and "Traceback" not in proc.stderr


def test_plain_dummy_removes_the_marker(tmp_path):
    d = str(tmp_path / "m")
    tiny_model.write("glm5", d, seed=3)
    assert tiny_model.scaled_dummy_seed(d) == 3
    tiny_model.write("glm5", d, force=True, scaled_dummy=False)
    assert tiny_model.scaled_dummy_seed(d) is None
    assert tiny_model.scaled_dummy_seed(None) is None
