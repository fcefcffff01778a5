"""--enable-cp-l3 reaches SGLang as its own dynamic storage backend (CLI, --config YAML, Engine), every startup
error is a clear plugin error before serving, and the CPU stand-ins never get near a server or a GPU."""

import json

import pytest

from sglang_glm_ext.declare import PluginFlagError
from sglang_glm_ext.l3.hicache import extra_config
from sglang_glm_ext.l3 import hooks

from l3kit import write_config

# Each test parses a launch through SGLang: its env exports, logger set-up and the L3 latch are put back.
pytestmark = pytest.mark.usefixtures("sglang_state")


@pytest.fixture(scope="module", autouse=True)
def loaded(plugin):
    from sglang.srt.plugins import load_plugins

    load_plugins()


def parse(argv):
    from sglang.srt.server_args import prepare_server_args

    return prepare_server_args(argv)


def l3_argv(cfg, *more):
    return ["--model-path", "dummy", "--enable-hierarchical-cache", "--enable-cp-l3", "--cp-l3-config", cfg, *more]


def test_cli_flags_become_sglang_dynamic_backend_and_resolve(tmp_path):
    from sglang.srt.arg_groups.overrides import resolving_view

    cfg = write_config(tmp_path)
    sa = parse(l3_argv(cfg))
    assert sa.hicache_storage_backend == "dynamic"
    extra = json.loads(sa.hicache_storage_backend_extra_config)
    assert extra["backend_name"] == extra_config.BACKEND_NAME and extra["interface_v1"] == 1
    assert extra["module_path"] == extra_config.MODULE_PATH and extra["class_name"] == extra_config.CLASS_NAME
    assert extra["l3_config"] == cfg
    sa.resolve_once()  # the translated record is SGLang's input: every resolution handler reads these values
    view = resolving_view(sa)
    assert view.hicache_storage_backend == "dynamic"
    assert json.loads(view.hicache_storage_backend_extra_config) == extra


def test_a_command_line_launch_reads_the_config_once(tmp_path, monkeypatch):
    """The flag check, the CLI translation and resolve_once share one launch plan (l3/launch.py)."""
    from l3kit import opens_of

    cfg = write_config(tmp_path)
    opened = opens_of(monkeypatch, cfg)
    parse(l3_argv(cfg)).resolve_once()
    assert len(opened) == 1, opened


def test_the_cli_translation_runs_after_the_flag_hook_that_attaches_its_values():
    """Its patch declares after=("flags.from_cli",): the ledger applies that hook first, so it sits inside."""
    from sglang_glm_ext.patching.ledger import chain_depth
    from sglang_glm_ext.plugin import hooks as flag_hooks

    target = "sglang.srt.server_args.ServerArgs.from_cli_args"
    ours, flags_hook = chain_depth(target, hooks.hook_from_cli_args), chain_depth(target, flag_hooks.hook_from_cli_args)
    assert ours is not None and flags_hook is not None and ours < flags_hook


def test_config_yaml_and_sglang_controller_keys(tmp_path):
    cfg = write_config(tmp_path)
    y = tmp_path / "serve.yaml"
    y.write_text(f"model-path: dummy\nenable-hierarchical-cache: true\nenable-cp-l3: true\ncp-l3-config: {cfg}\n"
                 "hicache-storage-backend-extra-config: '{\"prefetch_threshold\": 128}'\n")
    sa = parse(["--config", str(y)])
    extra = json.loads(sa.hicache_storage_backend_extra_config)
    assert sa.hicache_storage_backend == "dynamic" and extra["prefetch_threshold"] == 128


def test_engine_keywords_are_translated_at_resolve(tmp_path):
    from sglang.srt.server_args import ServerArgs

    from sglang_glm_ext.plugin import flags

    cfg = write_config(tmp_path)
    # What Engine(enable_cp_l3=True, cp_l3_config=cfg, ...) builds (flags.hook_engine_init attaches the values).
    sa = ServerArgs(model_path="dummy", enable_hierarchical_cache=True)
    flags.attach(sa, flags.validate({"enable_cp_l3": True, "cp_l3_config": cfg}))
    assert sa.hicache_storage_backend is None
    sa.resolve_once()
    assert sa.hicache_storage_backend == "dynamic" and getattr(sa, hooks.TRANSLATED_ATTR)["deployment_id"]


def test_translation_happens_once_and_survives_pickling(tmp_path):
    import pickle

    cfg = write_config(tmp_path)
    sa = parse(l3_argv(cfg))
    assert hooks.translate(sa) is False  # already done by the CLI hook
    child = pickle.loads(pickle.dumps(sa))
    assert child.hicache_storage_backend == "dynamic" and hooks.translate(child) is False


@pytest.mark.parametrize("argv_extra,needle", [
    (["--hicache-storage-backend", "file"], "drop --hicache-storage-backend file"),
    (["--enable-kv-cache-sharding"], "does not serve --enable-kv-cache-sharding: .*rotation owner.*GPU PD-prefill"),
    (["--hicache-host-memory-mode", "buffer_only"], "buffer_only is not served"),
    (["--hicache-storage-backend-extra-config", '{"file_storage_path": "/x"}'], "cannot be combined"),
    (["--hicache-storage-backend-extra-config", "@/x.json"], "@FILE cannot be combined"),
    (["--hicache-storage-backend-extra-config", "{not json"], "is not JSON"),
    (["--dcp-size", "2"], "does not serve decode context parallelism .*indexer pool of GLM-5 for every backend"),
])
def test_conflicting_sglang_flags_are_refused_in_plugin_words(tmp_path, argv_extra, needle):
    with pytest.raises(SystemExit, match="sglang-glm-ext: .*" + needle.replace("(", r"\(")):
        parse(l3_argv(write_config(tmp_path), *argv_extra))


def test_dsa_layer_split_is_no_longer_refused_by_the_plugin(tmp_path):
    """--enable-dsa-cache-layer-split is served (each CP rank's own layers under a namespace naming its part): the
    flags translate; SGLang's own launch checks for the mode (PD prefill, DSA, interleave CP) still apply."""
    sa = parse(l3_argv(write_config(tmp_path), "--enable-dsa-cache-layer-split", "--hicache-mem-layout", "layer_first"))
    assert sa.hicache_storage_backend == "dynamic" and sa.enable_dsa_cache_layer_split


@pytest.mark.parametrize("layout", ["page_first", "page_first_direct", "page_first_kv_split"])
def test_dsa_layer_split_in_a_page_first_layout_is_refused_before_serving(tmp_path, layout):
    """Seen on the H200 (docs_internal/gpu_runs_2026-12-05.md, fourth session): SGLang 0.5.23 raises at the first
    write-back of a layer-sharded DSA indexer in page_first ("needs a per-layer LF->PF kernel"), its default layout;
    refused at launch."""
    with pytest.raises(SystemExit, match=f"needs --hicache-mem-layout layer_first, not {layout}: .*LF->PF"):
        parse(l3_argv(write_config(tmp_path), "--enable-dsa-cache-layer-split", "--hicache-mem-layout", layout))


def test_without_hierarchical_cache_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="needs --enable-hierarchical-cache"):
        parse(["--model-path", "dummy", "--enable-cp-l3", "--cp-l3-config", write_config(tmp_path)])


def test_engine_path_raises_a_value_error_at_resolve(tmp_path):
    from sglang.srt.server_args import ServerArgs

    from sglang_glm_ext.plugin import flags

    sa = ServerArgs(model_path="dummy")  # no --enable-hierarchical-cache
    flags.attach(sa, flags.validate({"enable_cp_l3": True, "cp_l3_config": write_config(tmp_path)}))
    with pytest.raises(PluginFlagError, match="needs --enable-hierarchical-cache"):
        sa.resolve_once()


def test_missing_and_invalid_config(tmp_path):
    with pytest.raises(SystemExit, match="no such file"):
        parse(l3_argv(str(tmp_path / "absent.toml")))
    bad = tmp_path / "bad.toml"
    bad.write_text("disks = 3\n")
    with pytest.raises(SystemExit, match="disks"):
        parse(l3_argv(str(bad)))


def test_unwritable_path_is_refused(tmp_path):
    import os

    ro = tmp_path / "ro"
    ro.mkdir()
    cfg = write_config(ro)
    os.chmod(ro / "l3", 0o500)
    try:
        if os.access(ro / "l3", os.W_OK):
            pytest.skip("running as a user that ignores permission bits (root)")
        with pytest.raises(SystemExit, match="not writable"):
            parse(l3_argv(cfg))
    finally:
        os.chmod(ro / "l3", 0o700)


def test_unwritable_path_is_refused_even_for_root(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    cfg = write_config(tmp_path)
    text = open(cfg).read().replace(f'path = "{tmp_path}/l3/disk0"', f'path = "{blocker}"')
    open(cfg, "w").write(text)
    with pytest.raises(SystemExit, match="is not a directory"):
        parse(l3_argv(cfg))


def test_require_plp_on_a_disk_not_known_safe_is_refused(tmp_path):
    cfg = write_config(tmp_path, require_plp=True, plp="assume_unsafe")
    with pytest.raises(SystemExit, match="require_plp"):
        parse(l3_argv(cfg))
    ok = write_config(tmp_path, name="safe", require_plp=True, plp="assume_safe")
    assert parse(l3_argv(ok)).hicache_storage_backend == "dynamic"


@pytest.mark.slow
def test_register_never_installs_the_cpu_standins(sglang_python):
    code = ("import sglang_glm_ext as p; led = p.register();"
            "import sglang.srt.mem_cache.pool_host.mla as m, sglang.srt.mem_cache.pool_host.dsa as d;"
            "demo = {s.patch.id: s.state.value for s in led.status.values() if s.patch.tier.value == 'demo'};"
            "print(sorted(set(demo.values())), hasattr(m, 'transfer_kv_direct'), hasattr(d, 'transfer_kv_direct'),"
            "len(demo))")
    out = sglang_python.run(code=code, timeout=300)  # a process where the plugin never ran
    assert out.stdout.split()[-4:] == ["['skipped']", "False", "False", "4"], out.stderr[-2000:]


def test_standins_refuse_where_a_gpu_is_visible(monkeypatch):
    import torch

    from sglang_glm_ext.l3.demo import cpu_standins

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(cpu_standins.StandinRefused, match="CUDA device is visible"):
        cpu_standins.install()
    assert not cpu_standins.installed()


def test_standins_refuse_in_a_process_that_launched_a_server(monkeypatch):
    from sglang.srt.server_args import ServerArgs

    from sglang_glm_ext.l3.demo import cpu_standins

    sa = ServerArgs(model_path="dummy")
    sa._launch_command = "python -m sglang.launch_server --model-path dummy"
    monkeypatch.setattr("sglang.srt.runtime_context.get_server_args", lambda: sa)
    with pytest.raises(cpu_standins.StandinRefused, match="was launched in this process"):
        cpu_standins.install()
    monkeypatch.undo()
    monkeypatch.setattr(hooks, "_LAUNCHED", True)
    with pytest.raises(cpu_standins.StandinRefused, match="launch was resolved"):
        cpu_standins.install()


@pytest.mark.slow
def test_a_server_launch_is_refused_where_the_standins_are_installed(sglang_python):
    # A process of its own (the plugin never ran there): install the stand-ins, then try to launch an Engine; the resolve hook refuses it before
    # anything starts.
    code = ("import sglang_glm_ext as p; p.register();"
            "from sglang_glm_ext.l3.demo import cpu_standins; cpu_standins.install();"
            "import sglang\n"
            "try:\n    sglang.Engine(model_path='dummy')\nexcept Exception as e:\n    print('REFUSED', e)\n")
    out = sglang_python.run(code=code, timeout=300)
    assert "REFUSED" in out.stdout and "stand-ins" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]


def _mla_storage_config(tp_rank, backend_name=extra_config.BACKEND_NAME, is_mla=True):
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

    return HiCacheStorageConfig(tp_rank=tp_rank, tp_size=4, pp_rank=0, pp_size=1, attn_cp_rank=tp_rank,
                                attn_cp_size=4, is_mla_model=is_mla, enable_storage_metrics=False,
                                is_page_first_layout=True, model_name="m",
                                extra_config={"backend_name": backend_name})


def test_writer_patch_makes_every_replica_a_writer_for_the_plugins_backend_only():
    import dataclasses

    from sglang.srt.managers.cache_controller import HiCacheController

    stock = _mla_storage_config(2)
    assert not stock.is_storage_writer  # 0.5.23: one MLA writer (tp_rank == dcp_rank)
    got = hooks.hook_cp_writers(stock, None)
    assert got.is_storage_writer and getattr(got, hooks.ALL_REPLICAS_WRITE_ATTR)
    assert dataclasses.asdict(got) == dataclasses.asdict(stock)  # field by field what SGLang built
    assert isinstance(got, type(stock)) and hooks.hook_cp_writers(got, None) is got
    # SGLang's own backup_skip (read by the base and the hybrid controller) follows the config it is given
    fget = HiCacheController.backup_skip.fget
    assert fget(type("C", (), {"storage_config": stock})()) is True
    assert fget(type("C", (), {"storage_config": got})()) is False
    # another backend, MHA pages: SGLang's own writer choice, untouched
    other = _mla_storage_config(2, backend_name="file")
    assert hooks.hook_cp_writers(other, None) is other
    mha = _mla_storage_config(2, is_mla=False)
    assert hooks.hook_cp_writers(mha, None) is mha


def test_sglang_backups_still_decide_the_writer_through_is_storage_writer():
    """Contract of l3.cp_storage_writers: every writer decision in 0.5.23 goes through is_storage_writer."""
    import inspect

    from sglang.srt.managers.cache_controller import HiCacheController
    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController

    assert "return not self.storage_config.is_storage_writer" in inspect.getsource(HiCacheController.backup_skip.fget)
    assert "if not self.backup_skip:" in inspect.getsource(HiCacheController.backup_thread_func)
    hybrid = inspect.getsource(HybridCacheController._page_backup_with_stable_layout)
    assert "if not self.backup_skip:" in hybrid and "super()._page_backup(operation)" in hybrid
    assert "if not self.backup_skip:" in inspect.getsource(HybridCacheController.should_backup)
    import sglang.srt.managers.cache_controller as cc_mod

    src = inspect.getsource(cc_mod)
    assert src.count("backup_skip") == 2 and src.count("is_storage_writer") == 1  # no other writer decision


def _budget_config(tmp_path, budget: str, name: str = "l3") -> str:
    cfg = write_config(tmp_path, name=name)
    text = open(cfg).read().replace('budget = "16MiB"', f'budget = "{budget}"')
    open(cfg, "w").write(text)
    return cfg


def test_a_budget_above_the_free_space_is_refused_at_launch_in_one_line(tmp_path):
    """Issue 20, item 2: a budget the disk cannot hold used to pass the launch checks and fail at attach (after the
    model loaded) with a chained traceback. Now the launch stops first, with one line that names the fix -- the
    same figures doctor reports."""
    import os
    import shutil

    free = shutil.disk_usage(tmp_path).free
    cfg = _budget_config(tmp_path, f"{(free + 2**40) // 2**20}MiB")  # a TiB more than the disk has free
    with pytest.raises(SystemExit) as exc:
        parse(l3_argv(cfg))
    msg = str(exc.value)
    assert "\n" not in msg and "disks[0].budget" in msg and "free" in msg and "lower disks[0].budget" in msg, msg
    # doctor says the same (one computation for both)
    from sglang_glm_ext.declare import DoctorInput
    from sglang_glm_ext.l3 import doctor

    part = doctor.report(DoctorInput({"enable_cp_l3": True, "cp_l3_config": cfg}, (), {}))
    assert any("lower disks[0].budget" in p for p in part.problems), part.problems
    assert os.path.isfile(cfg)


def test_slabs_already_on_disk_count_as_space_held_not_needed_again(tmp_path, monkeypatch):
    """The deployment's own preallocated slabs already hold their share of the budget: a restart with the same budget
    passes on a disk that has little room left, and only the part of a raised budget the slabs do not hold yet has
    to fit in the free space."""
    from sglang_glm_ext.l3.disk import space as diskcheck
    from sglang_glm_ext.l3.config import L3Config
    from sglang_glm_ext.l3.disk.format import Namespace, PayloadKind
    from sglang_glm_ext.l3.engine.store import L3Store

    cfg = _budget_config(tmp_path, "8MiB")
    s = L3Store.open(L3Config.load(cfg), rank=0, namespace=Namespace("m", "fp8", "page_first", 64, 0, 2, "r"),
                     page_bytes={PayloadKind.TARGET_KV: 64 * 1024 - 128})
    s.close()  # its slab (8 MiB, preallocated) stays on disk
    monkeypatch.setattr(diskcheck, "free_bytes", lambda path: 1 * 2**20)  # the file system is nearly full
    assert parse(l3_argv(cfg)).hicache_storage_backend == "dynamic"  # the same budget: already held
    raised = _budget_config(tmp_path, "12MiB")  # the same directories, 4 MiB more than the slab holds
    with pytest.raises(SystemExit, match=r"4\.0 MiB more .* 1\.0 MiB free.*at most 9\.0 MiB"):
        parse(l3_argv(raised))
