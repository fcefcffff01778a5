"""A launch's command line as a user pastes it into `doctor --`: environment words, the entry point, SGLang's
arguments (plugin/launch.py split_command; pure)."""

import pytest

from sglang_glm_ext.plugin.launch import Command, LaunchLineError, split_command


@pytest.mark.parametrize("words, want", [
    (["--", "python", "-m", "sglang.launch_server", "--model-path", "m"],
     Command({}, "python -m sglang.launch_server", ("--model-path", "m"))),
    (["SGLANG_HUGEPAGE_SIZE=1GB", "A_B=", "/usr/bin/python3.11", "-u", "-X", "dev", "-m", "sglang.launch_server"],
     Command({"SGLANG_HUGEPAGE_SIZE": "1GB", "A_B": ""}, "python -m sglang.launch_server", ())),
    (["env", "X=1", "sglang", "serve", "zai-org/GLM-5", "--tp", "8"],
     Command({"X": "1"}, "sglang serve", ("zai-org/GLM-5", "--tp", "8"))),
    (["--model-path", "m", "--tp=2"], Command({}, "arguments", ("--model-path", "m", "--tp=2"))),
])
def test_split_command(words, want):
    assert split_command(words) == want


@pytest.mark.parametrize("words, needle", [
    (["--"], "no launch"),
    (["A=1"], "no launch"),
    (["python", "-m", "vllm.entrypoints.openai.api_server"], "does not start SGLang's server"),
    (["python", "serve.py"], "does not start SGLang's server"),
    (["vllm", "serve", "m"], "cannot read 'vllm' as a launch"),
])
def test_not_a_launch_is_one_clear_error(words, needle):
    with pytest.raises(LaunchLineError, match=needle):
        split_command(words)


def test_describe_reads_back_as_typed():
    cmd = split_command(["SGLANG_HUGEPAGE_SIZE=1GB", "python", "-m", "sglang.launch_server", "--model-path", "m"])
    assert cmd.describe() == "SGLANG_HUGEPAGE_SIZE=1GB python -m sglang.launch_server --model-path m"
