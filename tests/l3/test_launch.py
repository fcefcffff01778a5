"""The L3 launch plan: one function decides what --enable-cp-l3 --cp-l3-config come to for the flag check, the
flag translation and doctor, and the config file is read once per process (again only when it changes)."""

import dataclasses
import os
from types import SimpleNamespace

import pytest

from sglang_glm_ext.declare import CARRIER_ATTR, DoctorInput, PluginFlagError
from sglang_glm_ext.l3 import doctor, feature, hooks, launch
from sglang_glm_ext.l3.config import L3Config
from sglang_glm_ext.l3.hicache import extra_config

from l3kit import opens_of, write_config


def values(**kw):
    return {"enable_cp_l3": False, "cp_l3_config": None, **kw}


def record(cfg, **kw):
    """What the translation reads off a ServerArgs record before resolution (flags attached)."""
    return SimpleNamespace(**{CARRIER_ATTR: values(enable_cp_l3=True, cp_l3_config=cfg),
                              "enable_hierarchical_cache": True, "hicache_storage_backend": None, **kw})


def test_off_is_no_plan_and_on_is_the_config_with_what_sglang_is_handed(tmp_path):
    assert launch.plan_launch(False, None) is None
    cfg = write_config(tmp_path)
    plan = launch.plan_launch(True, cfg)
    assert plan.config_path == cfg and plan.config == L3Config.from_file(cfg)
    assert plan.digest == extra_config.config_digest(cfg) == plan.extra_config["l3_config_sha256"]
    assert dict(plan.extra_config) == extra_config.build(cfg)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.digest = "0"
    with pytest.raises(TypeError):
        plan.extra_config["l3_config"] = "/elsewhere"  # a read-only view: what SGLang gets is built once
    sa = record(cfg, hicache_storage_backend_extra_config='{"prefetch_threshold": 8}')
    with_keys = launch.plan_launch(True, cfg, sa)
    assert with_keys.extra_config["prefetch_threshold"] == 8 and with_keys.config is plan.config


def test_the_check_the_translation_and_doctor_read_the_file_once(tmp_path, monkeypatch):
    cfg = write_config(tmp_path)
    opened = opens_of(monkeypatch, cfg)
    feature.validate(values(enable_cp_l3=True, cp_l3_config=cfg))
    sa = record(cfg)
    assert hooks.translate(sa) and sa.hicache_storage_backend == "dynamic"
    part = doctor.report(DoctorInput(values(enable_cp_l3=True, cp_l3_config=cfg), (), {}))
    assert part.problems == () and part.sections["l3"]["extra_config"] == getattr(sa, hooks.TRANSLATED_ATTR)[
        "extra_config"]
    assert len(opened) == 1, opened


def test_an_edited_file_is_read_again_and_an_unchanged_one_is_not(tmp_path, monkeypatch):
    cfg = write_config(tmp_path)
    opened = opens_of(monkeypatch, cfg)
    first = launch.plan_launch(True, cfg)
    assert launch.plan_launch(True, cfg).config is first.config and len(opened) == 1
    st = os.stat(cfg)
    with open(cfg, "a") as f:
        f.write("\n")  # the same settings, other bytes: a new digest
    os.utime(cfg, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    second = launch.plan_launch(True, cfg)
    assert len(opened) == 3  # the edit's own open, then one read
    assert second.digest != first.digest and second.digest == extra_config.config_digest(cfg)


def test_the_environment_the_parse_reads_is_part_of_what_was_read(tmp_path, monkeypatch):
    cfg = write_config(tmp_path)
    assert launch.plan_launch(True, cfg).config.cold_start == "clear"
    monkeypatch.setenv("SGLANG_CP_L3_COLD_START", "load")
    assert launch.plan_launch(True, cfg).config.cold_start == "load"


def test_a_refused_disk_check_is_not_kept(tmp_path, monkeypatch):
    from sglang_glm_ext.l3.disk import space

    cfg = write_config(tmp_path)
    opened = opens_of(monkeypatch, cfg)
    with monkeypatch.context() as m:
        m.setattr(space, "free_bytes", lambda path: 2**20)  # the file system is nearly full
        with pytest.raises(PluginFlagError, match=r"disks\[0\]\.budget"):
            launch.plan_launch(True, cfg)
    assert launch.plan_launch(True, cfg).config_path == cfg  # room again: checked again, and it passes
    assert len(opened) == 1


def test_a_missing_config_is_said_in_one_wording_by_the_launch_and_by_doctor(tmp_path):
    """doctor meets a missing config twice (the launch check, and the L3 part reading the file): the same words, so
    it reports it once."""
    missing = str(tmp_path / "none.toml")
    with pytest.raises(PluginFlagError) as refused:
        feature.validate(values(enable_cp_l3=True, cp_l3_config=missing))
    part = doctor.report(DoctorInput(values(cp_l3_config=missing), (), {}))
    assert part.problems == (str(refused.value),)
    assert str(refused.value) == (f"--cp-l3-config {missing}: no such file; give the path of an L3 config "
                                  "(sglang-glm-ext l3 example-config --dir DIR writes one)")


def _with_path(cfg: str, key: str, new: str) -> str:
    """The config file ``cfg`` with its ``disks[0].path`` or ``index.path`` replaced by ``new``."""
    text = open(cfg).read()
    old = os.path.join(os.path.dirname(cfg), "disk0" if key == "disks[0].path" else "index")
    assert f'path = "{old}"' in text
    open(cfg, "w").write(text.replace(f'path = "{old}"', f'path = "{new}"'))
    return cfg


@pytest.mark.parametrize("key", ["disks[0].path", "index.path"])
@pytest.mark.parametrize("kind", ["under a file", "proc"])
def test_a_bad_path_stops_the_launch_before_the_model_loads_and_doctor_says_the_same(tmp_path, key, kind):
    """Before, a disk path under a regular file passed the launch check and doctor (exit 0) and the server died at
    attach, after the model had loaded; a path under /proc was refused for having "0 B free"."""
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    bad = str(blocker / "l3") if kind == "under a file" else "/proc/glm-ext-l3-test"
    cfg = _with_path(write_config(tmp_path), key, bad)
    with pytest.raises(PluginFlagError) as refused:
        feature.validate(values(enable_cp_l3=True, cp_l3_config=cfg))
    msg = str(refused.value)
    assert msg.startswith(f"--cp-l3-config {cfg}: {key} {bad}") and "\n" not in msg, msg
    assert f"point {key} at a directory" in msg and "free" not in msg, msg
    assert (f"{blocker} is not a directory" if kind == "under a file" else "proc file system") in msg, msg
    part = doctor.report(DoctorInput(values(enable_cp_l3=True, cp_l3_config=cfg), (), {}))
    assert part.problems == (msg,)  # one problem, the launch's own line
    assert part.sections["l3"]["error"] == msg
    if key == "disks[0].path":
        (row,) = part.hardware["l3_paths"]
        assert row["problems"] == [msg] and row["o_direct"] is None
    assert blocker.read_text() == "x" and not os.path.exists("/proc/glm-ext-l3-test")


def test_a_launch_check_that_passes_leaves_nothing_behind(tmp_path):
    cfg = write_config(tmp_path)
    launch.plan_launch(True, cfg)
    doctor.report(DoctorInput(values(enable_cp_l3=True, cp_l3_config=cfg), (), {}))
    assert sorted(os.listdir(os.path.dirname(cfg))) == ["l3.toml"]  # no slab directory, no index, no probe file


def test_a_config_the_server_cannot_read_is_one_line_naming_the_flag_and_the_fix(tmp_path, monkeypatch):
    """An unreadable file (root reads every file, so the open is made to fail): the flag, the reason, the fix; no
    placeholder, no Python repr."""
    path = write_config(tmp_path)

    def refuse(*a, **kw):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(launch, "open", refuse, raising=False)
    monkeypatch.setattr(launch, "_READS", {})
    with pytest.raises(PluginFlagError) as refused:
        feature.validate(values(enable_cp_l3=True, cp_l3_config=path))
    assert str(refused.value) == (f"--cp-l3-config {path}: cannot read it: Permission denied; make it readable by "
                                  f"the user that runs the server")
