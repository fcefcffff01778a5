"""The README's flag table is the generated one, .ci/run runs the README's test command, every plugin command the
README shows parses, its doctor launch lines are launches doctor reads, and the wheel its install section builds
carries the plugin."""

import pathlib
import re

import pytest

from sglang_glm_ext.plugin.docs import flags_table

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_flag_table_is_current():
    text = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- flags:begin[^\n]*-->\n(.*?)<!-- flags:end -->", text, re.S)
    assert m, "README lost its flags:begin/flags:end markers"
    assert m.group(1) == flags_table(), "README flag table is stale: paste `sglang-glm-ext flags` between the markers"


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "```bash\nbash scripts/test.sh\n```" in readme
    assert re.search(r"^bash scripts/test\.sh\b", ci, re.M)


def test_the_readme_lanes_select_with_markers_pytest_declares():
    """The quick and slow lanes the README shows are -m expressions over markers pyproject.toml declares, and the
    server tests are in the slow lane (the quick lane never starts a server)."""
    import tomllib

    readme = (ROOT / "README.md").read_text()
    assert '```bash\nbash scripts/test.sh -m "not slow"\nbash scripts/test.sh -m "slow and not server"\n```' in readme
    markers = {m.split(":")[0] for m in
               tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]}
    assert {"slow", "server"} <= markers
    assert "item.add_marker(pytest.mark.slow)" in (ROOT / "tests" / "server" / "conftest.py").read_text()


# ---- the commands the README shows ----

def _bash_blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", text, re.S)


def _readme_commands(program: str) -> list[list[str]]:
    """Each command line of the README's bash blocks that runs `program`, as argv (comment dropped, `[...]`
    optional groups taken as given)."""
    import shlex

    out = []
    for block in _bash_blocks((ROOT / "README.md").read_text()):
        for line in block.splitlines():
            if line.split(maxsplit=1)[:1] != [program]:
                continue
            words = shlex.split(re.split(r"\s#\s", line)[0].replace("[", " ").replace("]", " "))
            out.append(words[1:])
    return out


def test_every_plugin_command_in_the_readme_parses():
    """A documented `sglang-glm-ext ...` line the CLI would reject (a renamed option, a dropped subcommand) fails."""
    from sglang_glm_ext.plugin.cli import build_parser

    commands = _readme_commands("sglang-glm-ext")
    assert len(commands) >= 10
    used = set()
    for argv in commands:
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as exc:
            if argv == ["--version"] and exc.code == 0:
                continue
            raise AssertionError(f"README: `sglang-glm-ext {' '.join(argv)}` does not parse") from None
        used.add(args.command)
    assert {"doctor", "l3", "demo"} <= used


def test_readme_states_fsck_exit_codes_as_the_code_defines_them():
    """The README said "exit 1 on corruption" while 1 meant "repaired": its sentence is now the code's own."""
    from sglang_glm_ext.l3.tools import exit_codes

    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"`l3 fsck` exit status, as e2fsck's: {exit_codes.SUMMARY}." in readme
    assert "exit 1 on corruption" not in readme
    assert [a[:2] for a in _readme_commands("sglang-glm-ext") if a[:2] in (["l3", "fsck"], ["l3", "ls"])] == \
        [["l3", "fsck"], ["l3", "ls"]]


def test_readme_doctor_launch_lines_are_launches_doctor_reads():
    from sglang_glm_ext.plugin.cli import build_parser
    from sglang_glm_ext.plugin.launch import ENTRIES, split_command

    lines = [a for a in _readme_commands("sglang-glm-ext") if a[:1] == ["doctor"] and "--" in a]
    assert len(lines) >= 2
    entries = set()
    for argv in lines:
        words = build_parser().parse_args(argv).launch_line
        entries.add(split_command(words).entry)
    assert entries == set(ENTRIES)  # both ways SGLang is started are shown


def test_readme_says_where_torch_extensions_go_as_the_scripts_do():
    readme = (ROOT / "README.md").read_text()
    assert "export TORCH_EXTENSIONS_DIR=$PWD/.torch_extensions" in readme
    for script in ("main.sh", "test.sh"):
        text = (ROOT / "scripts" / script).read_text()
        assert 'TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$PWD/.torch_extensions}"' in text, script
    assert ".torch_extensions/" in (ROOT / ".gitignore").read_text()


@pytest.mark.slow
def test_the_wheel_the_readme_installs_builds_and_carries_the_plugin(tmp_path):
    """README "Install on a GPU node": `pip wheel --no-deps` of a checkout gives one pure-Python wheel with every
    module, the `sglang.srt.plugins` entry point and the console script; installed, it is what Python loads."""
    import subprocess
    import sys
    import zipfile

    install = next(b for b in _bash_blocks((ROOT / "README.md").read_text()) if "pip wheel --no-deps" in b)
    assert "pip install dist/sglang_glm_ext-" in install
    # a copy of the files git keeps (tracked, or new and not ignored: what the next commit's checkout holds, as
    # scripts/gpu/build_carry.py copies them), and no build/ left in this one
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.split(b"\0")
    src = tmp_path / "checkout"
    for name in filter(None, (f.decode() for f in files)):
        dest = src / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / name).is_file():
            dest.write_bytes((ROOT / name).read_bytes())
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(src),
                    "-w", str(dist)], check=True, capture_output=True, timeout=600)
    from sglang_glm_ext.plugin import __version__

    (wheel,) = dist.glob("*.whl")
    assert wheel.name == f"sglang_glm_ext-{__version__}-py3-none-any.whl"  # the name the README installs
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {str(p.relative_to(src)) for p in (src / "sglang_glm_ext").rglob("*.py")}
    assert modules and modules <= names, sorted(modules - names)
    eps = zipfile.ZipFile(wheel).read(f"sglang_glm_ext-{__version__}.dist-info/entry_points.txt").decode()
    assert "[sglang.srt.plugins]\nglm_ext = sglang_glm_ext:register" in eps
    assert "[console_scripts]\nsglang-glm-ext = sglang_glm_ext.cli:main" in eps
    meta = zipfile.ZipFile(wheel).read(f"sglang_glm_ext-{__version__}.dist-info/METADATA").decode()
    assert "\nLicense: Apache-2.0\n" in meta and "](docs/" not in meta  # the index page links no docs/ file
    assert any(n.endswith(".dist-info/licenses/LICENSE") or n.endswith(".dist-info/LICENSE") for n in names)
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=600)
    code = ("import importlib.metadata as m, sglang_glm_ext, sglang_glm_ext.plugin.cli as c;"
            "ep = next(e for e in m.entry_points(group='sglang.srt.plugins') if e.name == 'glm_ext');"
            "print(sglang_glm_ext.__file__); print(ep.value); c.main(['--version'])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"}, timeout=300)
    out = proc.stdout.splitlines()
    assert out[0].startswith(str(target)) and out[1] == "sglang_glm_ext:register", proc.stdout + proc.stderr
    assert out[2] == f"sglang-glm-ext {__version__}"


# ---- packaging: what the index page and the wheel say ----

def _project() -> dict:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_the_long_description_links_nothing_the_wheel_lacks():
    """The index page is the package's long description: a relative link there (to docs/, to the README's
    neighbours) is dead, since neither the wheel nor the index page carries those files."""
    readme = _project()["readme"]
    assert isinstance(readme, dict) and readme["content-type"] == "text/markdown"
    text = readme["text"]
    targets = re.findall(r"\]\(([^)]*)\)", text) + re.findall(r"^\s*\[[^\]]+\]:\s*(\S+)", text, re.M)
    assert [u for u in targets if not u.startswith("https://")] == []
    assert "sglang==0.5.23" in text and "docs/" in text  # where the operator docs are, named, not linked


def test_the_license_file_is_the_apache_2_text_the_metadata_names():
    assert _project()["license"] == {"text": "Apache-2.0"}
    text = (ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License\n                           Version 2.0, January 2004")
    assert "END OF TERMS AND CONDITIONS" in text and text.count("\n") > 190
    assert any(c.startswith("Development Status ::") for c in _project()["classifiers"])


# ---- scripts/test.sh: the shuffled order and its seed ----

def _run_test_sh(tmp_path, seed):
    """scripts/test.sh in a copy of the checkout whose set-up is a no-op and whose python prints its argv."""
    import subprocess

    (tmp_path / "scripts").mkdir(exist_ok=True)
    (tmp_path / "scripts" / "test.sh").write_text((ROOT / "scripts" / "test.sh").read_text())
    (tmp_path / "scripts" / "setup_env.sh").write_text("exit 0\n")
    py = tmp_path / ".venv" / "bin" / "python"
    py.parent.mkdir(parents=True, exist_ok=True)
    py.write_text('#!/bin/sh\necho "ARGV $*"\n')
    py.chmod(0o755)
    env = {k: v for k, v in __import__("os").environ.items() if k != "SGLANG_GLM_EXT_TEST_SEED"}
    if seed is not None:
        env["SGLANG_GLM_EXT_TEST_SEED"] = seed
    return subprocess.run(["bash", str(tmp_path / "scripts" / "test.sh"), "-q", "-m", "not slow"], env=env,
                          capture_output=True, text=True, timeout=60)


def test_test_sh_shuffles_from_a_seed_it_prints_fixed_by_default_and_replayable(tmp_path):
    default = _run_test_sh(tmp_path, None)
    m = re.search(r"seed (\d+) \(replay: SGLANG_GLM_EXT_TEST_SEED=\1 ", default.stdout)
    assert default.returncode == 0 and m, default.stdout + default.stderr
    assert f"ARGV -m pytest --random-order-bucket=module --random-order-seed={m.group(1)} -q -m not slow" \
        in default.stdout
    assert _run_test_sh(tmp_path, None).stdout == default.stdout  # CI's order: the same every run
    again = _run_test_sh(tmp_path, "4711")
    assert "seed 4711 " in again.stdout and "--random-order-seed=4711 -q" in again.stdout
    drawn = _run_test_sh(tmp_path, "random")
    n = re.search(r"seed (\d+) ", drawn.stdout).group(1)
    assert f"--random-order-seed={n} -q" in drawn.stdout  # the seed printed is the seed run
    off = _run_test_sh(tmp_path, "off")
    assert "file order" in off.stdout and "ARGV -m pytest -q -m not slow" in off.stdout and "random" not in off.stdout
    bad = _run_test_sh(tmp_path, "12a")
    assert bad.returncode == 2 and "SGLANG_GLM_EXT_TEST_SEED must be a number" in bad.stderr and "ARGV" not in bad.stdout


def test_random_order_is_in_the_test_extra():
    import tomllib

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    assert any(r.startswith("pytest-random-order") for r in extra)
