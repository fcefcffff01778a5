"""hugepages' doctor part (sglang_glm_ext/hugepages/doctor.py): the node's hugepages, every size per NUMA node, and
whether a hugepage-backed launch fits; the launch reaches it through DoctorInput.launch."""

from __future__ import annotations

import json
import os

import pytest

from sglang_glm_ext.declare import DoctorInput
from sglang_glm_ext.hugepages import doctor

MB2, GB1 = 2048, 1048576
ORIGINAL_KEYS = {"total", "free", "size_kb", "mounts"}  # doctor schema 1 had these; they stay
ALL_KEYS = ORIGINAL_KEYS | {"default_size_kb", "sizes", "selected", "cgroup_limits", "fit", "unknown"}


# ---- the original keys: /proc/meminfo's default size and the hugetlbfs mounts ----

def test_this_machine_reports_counts_size_and_hugetlbfs_mounts():
    info, _ = doctor.hugepages()
    assert set(info) == ALL_KEYS
    assert 0 <= info["free"] <= info["total"] and info["size_kb"] >= 0 and isinstance(info["mounts"], list)


def test_original_keys_parse_meminfo_and_mounts(fake_sysfs):
    fs = fake_sysfs()
    fs.write("proc/meminfo", "MemTotal: 1 kB\nHugePages_Total:      64\nHugePages_Free:       10\n"
             "Hugepagesize:    2048 kB\n")
    fs.write("proc/mounts", "proc /proc proc rw 0 0\nnone /dev/hugepages hugetlbfs rw 0 0\n")
    info, problems = doctor.hugepages(fs.root)
    assert {k: info[k] for k in ORIGINAL_KEYS} == {"total": 64, "free": 10, "size_kb": 2048,
                                                    "mounts": ["/dev/hugepages"]}
    assert problems == []


def test_empty_root_reports_zeros_and_nothing_else(tmp_path):
    info, problems = doctor.hugepages(str(tmp_path), selected_raw=None)
    assert {k: info[k] for k in ORIGINAL_KEYS} == {"total": 0, "free": 0, "size_kb": 0, "mounts": []}
    assert info["sizes"] == [] and info["fit"] is None and problems == []


# ---- every size, per node; the selected size; the fit of a launch ----

def test_report_lists_every_size_and_node(fake_sysfs):
    fs = fake_sysfs(nodes=(0, 1)).pool(MB2, free=100, total=120, resv=10, node_free={0: 60, 1: 40})
    fs.pool(GB1, free=4, node_free={0: 2, 1: 2})
    fs.write("proc/meminfo", "HugePages_Total:     120\nHugePages_Free:      100\nHugepagesize:       2048 kB\n")
    info, problems = doctor.hugepages(fs.root, selected_raw="1GB")
    assert problems == [] and set(info) == ALL_KEYS
    assert (info["total"], info["free"], info["size_kb"], info["default_size_kb"]) == (120, 100, 2048, 2048)
    two, one = info["sizes"]
    assert (two["size_kb"], two["total"], two["free"], two["resv"], two["usable"]) == (MB2, 120, 100, 10, 90)
    assert [(n["node"], n["free"]) for n in two["nodes"]] == [(0, 60), (1, 40)]
    assert one["size_kb"] == GB1 and one["usable"] == 4
    assert info["selected"] == {"env": "1GB", "size_kb": GB1, "error": None} and info["fit"] is None


def test_fit_for_an_explicit_hicache_size(fake_sysfs):
    fs = fake_sysfs().pool(GB1, free=800)
    info, problems = doctor.hugepages(fs.root, selected_raw="1GB", hicache_size=100, ranks_per_node=8,
                                      ranks_source="x")
    assert info["fit"]["fits"] is True and info["fit"]["need_pages"] == 752 and problems == []
    info, problems = doctor.hugepages(fs.root, selected_raw="1GB", hicache_size=100, ranks_per_node=9,
                                      ranks_source="x")
    fit = info["fit"]
    assert fit["fits"] is False and fit["need_pages"] == 846 and fit["usable_pages"] == 800
    assert "hugepagesz=1G hugepages=846" in fit["message"] and "at most 94 GB per rank (88.0 GiB)" in fit["message"]
    assert len(problems) == 1 and "846 pages of 1 GB" in problems[0]


def test_fit_without_a_selected_size_says_ordinary_pages(fake_sysfs):
    fs = fake_sysfs().pool(MB2, free=10)
    info, problems = doctor.hugepages(fs.root, selected_raw=None, hicache_size=100, ranks_per_node=1)
    assert info["fit"]["fits"] is None and "ordinary pages" in info["fit"]["message"] and problems == []


def test_bad_size_and_missing_pool_are_problems_not_tracebacks(fake_sysfs):
    fs = fake_sysfs().pool(MB2, free=10)
    info, problems = doctor.hugepages(fs.root, selected_raw="2M", hicache_size=10, ranks_per_node=1)
    assert info["selected"]["error"] and any("2MB or 1GB" in p for p in problems)
    info, problems = doctor.hugepages(fs.root, selected_raw="1GB")
    assert any("no 1 GB pool" in p for p in problems)


def test_each_hugepage_problem_carries_its_fix(fake_sysfs):
    fs = fake_sysfs().pool(GB1, free=800)
    _, (short,) = doctor.hugepages(fs.root, selected_raw="1GB", hicache_size=100, ranks_per_node=9,
                                   ranks_source="x")
    assert short.fix == ("reserve 46 more 1 GB pages (echo 846 > /sys/kernel/mm/hugepages/hugepages-1048576kB/"
                         "nr_hugepages), or lower --hicache-size to at most 94 GB per rank (88.0 GiB), or "
                         "--hicache-ratio")
    _, (bad,) = doctor.hugepages(fs.root, selected_raw="3MB")
    assert bad.fix == "set SGLANG_HUGEPAGE_SIZE to 2MB or 1GB, or unset it"
    _, (missing,) = doctor.hugepages(fs.root, selected_raw="2MB")
    assert missing.fix.startswith("boot with hugepagesz=2M hugepages=N on the kernel command line")


def test_a_launch_whose_allocator_ignores_hugepages_is_a_problem(monkeypatch):
    monkeypatch.setattr(doctor, "hugepages", lambda root, **kw: ({"selected": {"size_kb": GB1}}, []))
    monkeypatch.setattr(doctor, "selected_size", lambda: "1GB")
    monkeypatch.delenv("SGLANG_GLM_EXT_HUGEPAGE_FALLBACK", raising=False)
    launch = {"enable_hierarchical_cache": True, "hicache_storage_backend": "mooncake"}
    (problem,) = doctor.report(DoctorInput({}, (), {}, launch=launch)).problems
    assert "--hicache-storage-backend mooncake allocates the host KV pool with its own allocator" in problem
    assert "unset SGLANG_HUGEPAGE_SIZE" in problem.fix
    # SGLang's default allocator (no backend, or file), HiCache off, or the fallback allowed: nothing to say
    for other in ({**launch, "hicache_storage_backend": None}, {**launch, "hicache_storage_backend": "file"},
                  {**launch, "enable_hierarchical_cache": False}):
        assert doctor.report(DoctorInput({}, (), {}, launch=other)).problems == ()
    monkeypatch.setenv("SGLANG_GLM_EXT_HUGEPAGE_FALLBACK", "1")
    assert doctor.report(DoctorInput({}, (), {}, launch=launch)).problems == ()


def test_unreadable_figures_are_null_and_named(fake_sysfs):
    fs = fake_sysfs().pool(MB2, free=10)
    fs.write("sys/kernel/mm/hugepages/hugepages-2048kB/resv_hugepages", "garbage")
    fs.write("proc/meminfo", "HugePages_Total: lots\n")
    info, problems = doctor.hugepages(fs.root, selected_raw="2MB", hicache_size=1, ranks_per_node=1)
    assert info["sizes"][0]["resv"] is None and info["sizes"][0]["usable"] is None
    assert any("resv_hugepages: not a number" in u for u in info["unknown"])
    assert info["fit"]["fits"] is None and info["fit"]["message"].startswith("cannot tell")
    assert info["total"] == 0
    json.dumps(info)  # the JSON doctor prints
    assert any("unknown" in line for line in doctor.render_lines(info))


# ---- report(DoctorInput): what doctor calls ----

def test_report_takes_the_launch_from_doctor_input(monkeypatch):
    seen = {}

    def fake(root, **kw):
        seen.update(kw, root=root)
        return {"x": 1}, ["p"]

    monkeypatch.setattr(doctor, "hugepages", fake)
    monkeypatch.setattr(doctor, "selected_size", lambda: "1GB")
    part = doctor.report(DoctorInput({}, (), {}, launch={"hicache_size": 100, "ranks_per_node": 8}))
    assert part.hardware == {"hugepages": {"x": 1}} and part.problems == ("p",)
    assert seen == {"root": "/", "selected_raw": "1GB", "hicache_size": 100, "ranks_per_node": 8,
                    "ranks_source": "--ranks-per-node"}
    doctor.report(DoctorInput({}, ({"index": 0}, {"index": 1}), {}, launch={"hicache_size": 5}))
    assert (seen["ranks_per_node"], seen["ranks_source"]) == (2, "one per visible GPU")
    doctor.report(DoctorInput({}, (), {}))  # no launch given: no fit to judge, one rank assumed
    assert (seen["hicache_size"], seen["ranks_per_node"], seen["ranks_source"]) == (
        None, 1, "default; pass --ranks-per-node")


def test_selected_size_is_read_as_sglang_reads_it(monkeypatch):
    monkeypatch.setenv("SGLANG_HUGEPAGE_SIZE", "1GB")
    assert doctor.selected_size() == "1GB"
    monkeypatch.delenv("SGLANG_HUGEPAGE_SIZE")
    assert doctor.selected_size() is None


# ---- through `sglang-glm-ext doctor` ----

@pytest.fixture
def _doctor(sglang_python):
    """`sglang-glm-ext doctor ARGS` in a process of its own, forked from a parent that imported SGLang only."""

    def run(*args, env=None):
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
        full_env.update(env or {})
        return sglang_python.run(module="sglang_glm_ext.cli", argv=["doctor", *args], env=full_env, timeout=300)

    return run


def test_doctor_cli_reports_the_fit_of_a_launch(_doctor):
    # This machine's real sysfs. Whatever it has reserved, 1000 x 10^6 GB does not fit in it.
    proc = _doctor("--json", "--hicache-size", "1000000", "--ranks-per-node", "1000",
                   env={"SGLANG_HUGEPAGE_SIZE": "2MB"})
    assert proc.returncode == 1, proc.stderr[-2000:]
    rep = json.loads(proc.stdout)
    hpinfo = rep["hardware"]["hugepages"]
    assert set(hpinfo) == ALL_KEYS
    assert hpinfo["fit"]["fits"] is False and hpinfo["fit"]["ranks_source"] == "--ranks-per-node"
    assert any("not enough 2 MB hugepages" in p for p in rep["problems"])
    # The short default names the problem; -v adds the hugepage table with the verdict.
    text = _doctor("--hicache-size", "1000000", "--ranks-per-node", "1000", env={"SGLANG_HUGEPAGE_SIZE": "2MB"})
    assert "not enough 2 MB hugepages" in text.stdout
    text = _doctor("-v", "--hicache-size", "1000000", "--ranks-per-node", "1000", env={"SGLANG_HUGEPAGE_SIZE": "2MB"})
    assert "DOES NOT FIT" in text.stdout and "hugepages 2 MB: total" in text.stdout


def test_doctor_cli_rejects_odd_option_values_without_a_traceback(_doctor):
    proc = _doctor("--hicache-size", "lots")
    assert proc.returncode == 2 and "expected a whole number" in proc.stderr and "Traceback" not in proc.stderr
    proc = _doctor("--ranks-per-node", "0")
    assert proc.returncode == 2 and "must be positive" in proc.stderr and "Traceback" not in proc.stderr
    proc = _doctor("--json", env={"SGLANG_HUGEPAGE_SIZE": "huge"})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert any("SGLANG_HUGEPAGE_SIZE='huge'" in p for p in json.loads(proc.stdout)["problems"])
