"""Plugin flags reach ServerArgs through SGLang's CLI, --config YAML, pickling and the Engine(...) API."""

import pickle

import pytest

from sglang_glm_ext.plugin import flags, hooks

# Each test parses a launch through SGLang: its env exports, logger set-up and the L3 latch are put back.
pytestmark = pytest.mark.usefixtures("sglang_state")


@pytest.fixture(scope="module", autouse=True)
def loaded():
    from sglang.srt.plugins import load_plugins

    load_plugins()


def parse(argv):
    from sglang.srt.server_args import prepare_server_args

    return prepare_server_args(argv)


def test_cli_flag_lands_on_record_and_survives_pickling():
    sa = parse(["--model-path", "dummy", "--log-cuda-graph-buffers"])
    assert sa._glm_ext["log_cuda_graph_buffers"] is True
    # Scheduler subprocesses get the record pickled; the bookkeeping attribute must travel with it.
    assert pickle.loads(pickle.dumps(sa))._glm_ext == sa._glm_ext
    assert flags.get(sa)["log_cuda_graph_buffers"] is True


def test_defaults_when_no_flag_given():
    sa = parse(["--model-path", "dummy"])
    assert sa._glm_ext == {f.name: f.default for f in flags.FLAGS}


def test_help_lists_the_plugin_group(capsys):
    with pytest.raises(SystemExit):
        parse(["--help"])
    out = capsys.readouterr().out
    assert "sglang-glm-ext" in out
    for f in flags.FLAGS:
        assert f.cli in out
    # a value flag shows its kind, as the README's flag table does, not the carrier's dest (GLM_EXT__CP_L3_CONFIG)
    assert "--cp-l3-config PATH" in out and "GLM_EXT__" not in out


def test_config_yaml_accepts_plugin_keys(tmp_path):
    cfg = tmp_path / "serve.yaml"
    cfg.write_text("model-path: dummy\nlog-cuda-graph-buffers: true\n")
    sa = parse(["--config", str(cfg)])
    assert sa._glm_ext["log_cuda_graph_buffers"] is True


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--enable-cp-l3"], "needs --cp-l3-config"),
        (["--cp-l3-config", "x.toml"], "without --enable-cp-l3"),
        (["--enable-cp-l3", "--cp-l3-config", "/nonexistent/l3.toml"], "no such file"),
    ],
)
def test_bad_l3_flags_fail_before_serving(argv, needle):
    with pytest.raises(SystemExit) as exc:
        parse(["--model-path", "dummy", *argv])
    assert needle in str(exc.value)


def test_env_var_switches_feature_on(monkeypatch):
    monkeypatch.setenv("SGLANG_LOG_CG_BUFFERS", "1")
    sa = parse(["--model-path", "dummy"])
    assert flags.get(sa)["log_cuda_graph_buffers"] is True


class _FakeEngine:
    """Stands in for Engine: its __init__ builds ServerArgs from kwargs exactly as Engine.__init__ does
    (`self.server_args_class(**kwargs)`; tests/patching/test_contract.py pins that line in the real Engine)."""

    from sglang.srt.server_args import ServerArgs as server_args_class

    built = None

    def original(self, **kwargs):
        self.built = self.server_args_class(**kwargs)


def test_engine_keywords_are_taken_out_and_attached():
    eng = _FakeEngine()
    hooks.hook_engine_init(lambda self, **kw: self.original(**kw), eng, model_path="dummy",
                           log_cuda_graph_buffers=True)
    assert eng.built._glm_ext["log_cuda_graph_buffers"] is True
    assert "server_args_class" not in eng.__dict__  # the per-construction shadow is gone afterwards


def test_engine_rejects_bad_plugin_keyword_value():
    eng = _FakeEngine()
    with pytest.raises(flags.PluginFlagError, match="expects true/false"):
        hooks.hook_engine_init(lambda self, **kw: self.original(**kw), eng, model_path="dummy",
                               log_cuda_graph_buffers="yes")


def test_real_engine_refuses_bad_l3_options_before_launching():
    import sglang

    with pytest.raises(flags.PluginFlagError, match="needs --cp-l3-config"):
        sglang.Engine(model_path="dummy", enable_cp_l3=True)


def test_enable_cp_l3_with_valid_config_needs_hierarchical_cache(tmp_path):
    # The backend is wired (tests/l3/hicache/test_hooks.py); without HiCache there is no tier to put L3 under.
    from sglang_glm_ext.l3.config import example_config

    path = tmp_path / "l3.toml"
    path.write_text(example_config(str(tmp_path / "disk")))
    with pytest.raises(SystemExit, match="needs --enable-hierarchical-cache"):
        parse(["--model-path", "dummy", "--enable-cp-l3", "--cp-l3-config", str(path)])
    sa = parse(["--model-path", "dummy", "--enable-hierarchical-cache", "--enable-cp-l3", "--cp-l3-config", str(path)])
    assert sa.hicache_storage_backend == "dynamic"


@pytest.mark.slow
def test_scheduler_process_reads_flags_from_the_published_record():
    # Scheduler subprocesses get the record pickled and published; features read flags.get() with no argument.
    import multiprocessing as mp

    sa = parse(["--model-path", "dummy", "--log-cuda-graph-buffers"])
    ctx = mp.get_context("spawn")  # SGLang starts schedulers with spawn: nothing is inherited but the pickle
    with ctx.Pool(1) as pool:
        got = pool.apply(_child_reads_flags, (sa,))
    assert got["log_cuda_graph_buffers"] is True


def _child_reads_flags(server_args):
    from sglang.srt.server_args import set_global_server_args_for_scheduler

    from sglang_glm_ext.plugin import flags as child_flags

    set_global_server_args_for_scheduler(server_args)
    return child_flags.get()


def test_switched_on_feature_whose_patch_failed_refuses_the_launch(monkeypatch):
    import sglang_glm_ext as plugin
    from sglang_glm_ext.patching.ledger import State

    led = plugin.ledger_state()
    cg = [s for s in led.status.values() if s.patch.feature.name == "cg_mem"]
    assert cg, "cg_mem declares its patches (sglang_glm_ext/cuda_graph_mem/patches.py)"
    monkeypatch.setattr(cg[0], "state", State.FAILED)
    monkeypatch.setattr(cg[0], "detail", "target moved")
    with pytest.raises(SystemExit, match="feature 'cg_mem' cannot work: patch .* failed: target moved"):
        parse(["--model-path", "dummy", "--log-cuda-graph-buffers"])
    monkeypatch.setenv("SGLANG_LOG_CG_BUFFERS", "1")  # the env-var route is refused the same way
    with pytest.raises(SystemExit, match="feature 'cg_mem' cannot work"):
        parse(["--model-path", "dummy"])
