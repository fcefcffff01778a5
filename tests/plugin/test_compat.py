"""The one version guard: the supported range, the installed version, and the one refusal."""

import pytest

from sglang_glm_ext.plugin import compat
from sglang_glm_ext.plugin.registry import PATCHES


@pytest.fixture(autouse=True)
def _not_forced(monkeypatch):
    monkeypatch.delenv("SGLANG_GLM_EXT_FORCE_UNSUPPORTED", raising=False)


def test_status_of_supported_unsupported_absent_and_forced(monkeypatch):
    ok = compat.version_status("0.5.23")
    assert ok.supported and ok.patches_allowed and not ok.forced
    old = compat.version_status("0.5.99")
    assert not old.supported and not old.patches_allowed and "NOT supported" in old.describe()
    monkeypatch.setattr(compat, "installed_sglang_version", lambda: None)
    absent = compat.version_status()
    assert absent.installed is None and not absent.patches_allowed and absent.describe() == "sglang is not installed"
    monkeypatch.setenv("SGLANG_GLM_EXT_FORCE_UNSUPPORTED", "1")
    forced = compat.version_status("0.5.99")
    assert forced.forced and forced.patches_allowed and "forced" in forced.describe()
    assert not compat.version_status().patches_allowed  # forcing needs an SGLang to patch


def test_installed_version_reads_distributions():
    assert compat.installed_sglang_version() == compat.installed_version("sglang") == "0.5.23"
    assert compat.installed_version("glm-ext-no-such-distribution") is None


def test_refusal_names_what_was_asked_and_both_versions():
    status = compat.version_status("0.5.99")
    with pytest.raises(compat.UnsupportedSGLangError) as exc:
        compat.refuse_unsupported(["--enable-cp-l3", "SGLANG_LOG_CG_BUFFERS"], status)
    msg = str(exc.value)
    assert isinstance(exc.value, SystemExit)  # load_plugins() swallows Exception, not SystemExit
    for needle in ("--enable-cp-l3, SGLANG_LOG_CG_BUFFERS", "0.5.99", "supported: 0.5.23",
                   "SGLANG_GLM_EXT_FORCE_UNSUPPORTED=1"):
        assert needle in msg, msg


def test_nothing_asked_or_supported_or_forced_passes(monkeypatch):
    compat.refuse_unsupported([], compat.version_status("0.5.99"))
    compat.refuse_unsupported(["--enable-cp-l3"], compat.version_status("0.5.23"))
    monkeypatch.setenv("SGLANG_GLM_EXT_FORCE_UNSUPPORTED", "1")
    compat.refuse_unsupported(["--enable-cp-l3"], compat.version_status("0.5.99"))


def test_refusal_reads_the_installed_version_when_no_status_is_given(monkeypatch):
    monkeypatch.setattr(compat, "installed_sglang_version", lambda: "0.5.99")
    with pytest.raises(compat.UnsupportedSGLangError, match="0.5.99"):
        compat.refuse_unsupported(["--log-cuda-graph-buffers"])


def test_every_patch_range_lies_inside_the_supported_range():
    # A patch release outside SUPPORTED_SGLANG could only ever be applied by force: a declaration mistake.
    for p in PATCHES:
        assert set(p.sglang_versions) <= set(compat.SUPPORTED_SGLANG), (p.id, p.sglang_versions)
