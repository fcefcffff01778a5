"""The plugin loads through SGLang's real load_plugins(), applies and verifies its hooks, honours its version
range and kill switch. Each case runs in a process of its own where the plugin never ran (load_plugins() runs once
per process): forked from a parent that imported SGLang only (the ``sglang_python`` fixture, tests/conftest.py)."""

import json
import os
import textwrap

import pytest

pytestmark = pytest.mark.slow  # a process per case

PROBE = textwrap.dedent(
    """
    import json, sys
    fake = __FAKE__
    if fake:
        import sglang_glm_ext.plugin.compat as compat
        compat.installed_sglang_version = lambda: fake
    sys.argv = ["launch_server"] + __ARGV__
    out = {}
    try:
        from sglang.srt.plugins import load_plugins
        load_plugins()
    except SystemExit as exc:
        out["exit"] = str(exc)
    import sglang_glm_ext as plugin
    from sglang.srt.plugins.hook_registry import HookRegistry
    led = plugin.ledger_state()
    out["disabled"] = plugin.is_disabled()
    out["states"] = {} if led is None else {k: v.state.value for k, v in led.status.items()}
    if led is not None:
        from sglang_glm_ext.patching.ledger import hook_in_chain
        # demo: never applied by register(); cpu_serve: only with SGLANG_GLM_EXT_CPU_SERVE=1 (tests/cpu_serve/);
        # gpu_bringup: only with SGLANG_GLM_EXT_GPU_BRINGUP=1 on a GPU without sgl_kernel (tests/gpu_bringup/)
        off = ("demo", "cpu_serve", "gpu_bringup")
        out["live"] = {p.id: hook_in_chain(p.target, p.resolve_hook()) for p in led.patches
                       if p.tier.value not in off}
        out["demo"] = sorted(p.id for p in led.patches if p.tier.value in off)
        out["second_register_same"] = plugin.register() is led
    if __CLI__:
        from sglang.srt.server_args import prepare_server_args
        try:
            sa = prepare_server_args(__CLI__)
            out["flags"] = getattr(sa, "_glm_ext", None)
        except SystemExit as exc:
            out["cli_exit"] = str(exc)
    print("RESULT" + json.dumps(out))
    """
)


@pytest.fixture
def run_probe(sglang_python):
    def run(*, fake=None, argv=(), cli=(), env=None):
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
        full_env.update(env or {})
        code = (PROBE.replace("__FAKE__", repr(fake)).replace("__ARGV__", repr(list(argv)))
                .replace("__CLI__", repr(list(cli))))
        proc = sglang_python.run(code=code, env=full_env, timeout=300)
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")]
        assert line, f"probe failed rc={proc.returncode}\nstdout={proc.stdout[-2000:]}\nstderr={proc.stderr[-4000:]}"
        return json.loads(line[-1][len("RESULT"):])

    return run


def test_load_plugins_applies_and_verifies_every_patch(run_probe):
    out = run_probe()
    assert out["states"], "the plugin was not loaded by SGLang's load_plugins()"
    # Demo/test-only stand-ins are declared but never applied by register(); every other patch is.
    assert {k: v for k, v in out["states"].items() if k not in out["demo"]} == \
        {k: "applied" for k in out["states"] if k not in out["demo"]}, out["states"]
    assert {out["states"][k] for k in out["demo"]} == {"skipped"}
    assert all(out["live"].values()), out["live"]
    assert out["second_register_same"] is True  # register() is idempotent


def test_kill_switch_applies_nothing_and_registers_no_flag(run_probe):
    out = run_probe(env={"SGLANG_GLM_EXT_DISABLE": "1"}, cli=["--model-path", "dummy", "--log-cuda-graph-buffers"])
    assert out["disabled"] is True and out["states"] == {}
    # With the plugin off the flag is SGLang's to reject: argparse exits with "unrecognized arguments".
    assert "cli_exit" in out


def test_unsupported_version_skips_feature_patches_but_keeps_guards(run_probe):
    out = run_probe(fake="0.5.99")
    from sglang_glm_ext.plugin.registry import PATCHES

    for p in PATCHES:
        expect = "applied" if p.tier.value == "guard" else "skipped"
        assert out["states"][p.id] == expect, (p.id, out["states"][p.id])


def test_unsupported_version_flag_in_argv_is_one_clear_error(run_probe):
    out = run_probe(fake="0.5.99", argv=["--model-path", "m", "--log-cuda-graph-buffers"])
    msg = out.get("exit", "")
    assert "0.5.99" in msg and "0.5.23" in msg and "--log-cuda-graph-buffers" in msg


def test_unsupported_version_env_var_is_one_clear_error(run_probe):
    out = run_probe(fake="0.5.99", env={"SGLANG_LOG_CG_BUFFERS": "1"})
    assert "SGLANG_LOG_CG_BUFFERS" in out.get("exit", "") and "0.5.99" in out["exit"]


def test_unsupported_version_flag_through_parser_is_one_clear_error(run_probe):
    # argv of this process carries no flag (e.g. Engine/prepare_server_args called by user code): the parser
    # hook still recognises the flag and refuses it with the versions named, not "unrecognized arguments".
    out = run_probe(fake="0.5.99", cli=["--model-path", "dummy", "--log-cuda-graph-buffers"])
    assert "0.5.99" in out["cli_exit"] and "supported: 0.5.23" in out["cli_exit"]


def test_force_applies_feature_patches_on_unsupported_version(run_probe):
    out = run_probe(fake="0.5.99", env={"SGLANG_GLM_EXT_FORCE_UNSUPPORTED": "1"},
                    cli=["--model-path", "dummy", "--log-cuda-graph-buffers"])
    assert {v for k, v in out["states"].items() if k not in out["demo"]} == {"applied"}
    assert out["flags"]["log_cuda_graph_buffers"] is True


@pytest.mark.parametrize("value", ["maybe", "2"])
def test_bad_kill_switch_value_is_loud(sglang_python, value):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    env["SGLANG_GLM_EXT_DISABLE"] = value
    proc = sglang_python.run(code="import sglang_glm_ext as p; p.register()", env=env, timeout=120)
    assert proc.returncode != 0 and "SGLANG_GLM_EXT_DISABLE" in proc.stderr


def test_register_checks_the_argv_it_is_given_not_the_process_argv(sglang_python):
    # doctor registers with argv=(): its own command line holds the flags it reports on, not a launch.
    code = textwrap.dedent(
        """
        import sys
        import sglang_glm_ext.plugin.compat as compat
        compat.installed_sglang_version = lambda: "0.5.99"
        sys.argv = ["sglang-glm-ext", "doctor", "--log-cuda-graph-buffers"]
        import sglang_glm_ext as plugin
        print("REGISTERED", plugin.register(argv=()) is not None)
        plugin._reset_for_tests()
        try:
            plugin.register(argv=["--model-path", "m", "--enable-cp-l3"])
        except SystemExit as exc:
            print("EXIT", exc)
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    proc = sglang_python.run(code=code, env=env, timeout=300)
    assert "REGISTERED True" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    (exit_line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("EXIT")]
    assert "--enable-cp-l3" in exit_line and "0.5.99" in exit_line and "--log-cuda-graph-buffers" not in exit_line
