#!/usr/bin/env python3
"""Build `.gpucarry/`: every wheel SGLang 0.5.23's real server and this plugin need on the lent GPU image.

    python3 scripts/gpu/build_carry.py [--out .gpucarry]

The lent H100 / H200 machines run an image with Python 3.12.3 (`python3`), torch 2.11.0+cu130 and triton 3.6.0, and
reach no package registry. Whatever SGLang's server path needs and the image lacks travels with the working tree, in
this ignored folder, named in `carry` (64 MiB for the whole tree, tracked files included). On the machine,
`source scripts/gpu/install_carry.sh` installs it into /tmp/site.

What goes in (`<out>/wheels/`), standard library only (pip does the downloads, here, through this machine's index):
  * sglang 0.5.23's cp312 wheel, slimmed: `sglang/multimodal_gen/` (diffusion serving; `sglang serve` guards its
    imports with `except ImportError`) and the Rust extensions `sglang/srt/rust_extensions/_server|_grpc|_bench|
    _multimodal` are dropped (loaded lazily, only by the Rust HTTP server, the native gRPC server, the Rust bench
    client and some multimodal processors; `python -m sglang.launch_server` imports none of them). The radix-tree core
    extension (`sglang/srt/mem_cache/rust_tree_core/mem_cache.*.so`) stays. The wheel's RECORD is rewritten.
  * the union of requirements/sglang-cpu-deps.txt, requirements/sglang-server-deps.txt and the plugin's own
    dependencies (pyproject.toml), with their transitive dependencies (Requires-Dist of each wheel, markers evaluated
    for CPython 3.12 on x86-64 Linux, `extra ==` lines only for extras something asked for), minus what the image
    already has (IMAGE_PACKAGES below) and minus NEVER_CARRY; one version of each, at the pins of those files
    (unpinned ones at pip's newest, except PREFER: two taken at a smaller release that still satisfies everything).
  * the plugin's own wheel, rebuilt on every run from a copy of the checkout (so a stale build/ cannot leak into it).
Downloaded wheels already in `<out>/wheels/` are re-used when they still satisfy every requirement; the original
(unslimmed) sglang wheel is cached outside the repository ($XDG_CACHE_HOME or ~/.cache, sglang-glm-ext-carry/).
Wheels no longer needed are removed. `<out>/manifest.txt` lists each wheel, its size and why it is carried.
Exit 1 if the folder exceeds 48 MiB (or anything cannot be resolved).
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SGLANG_PIN = "0.5.23"
LIMIT_MIB = 48.0
TARGET_MIB = 45.0
REQUIREMENT_FILES = ("requirements/sglang-cpu-deps.txt", "requirements/sglang-server-deps.txt")

# The image's glibc is >= 2.34 (sglang 0.5.23's cp312 wheel is manylinux_2_34 and installs there). pip matches each
# --platform exactly, so all are named; the first listed wins where a project ships several.
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in range(34, 16, -1)] + [
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
]
TARGET_ENV = {  # PEP 508 marker environment of the lent image
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "implementation_version": "3.12.3",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "os_name": "posix",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "platform_release": "",
    "platform_version": "",
}

# The image's Python packages (.library/device/KINDS.md, "Python packages already there", read 2026-11-17).
IMAGE_PACKAGES = """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna
imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft
pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers
statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm
tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope
triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl
zipp
""".split()
# Versions on the image where known (KINDS.md's pip-list row; xxhash from docs/research). An image package whose
# known version is older than a requirement's lower bound is carried, unless it is in KEEP_IMAGE_VERSION.
IMAGE_VERSIONS = {
    "accelerate": "1.15.0",
    "huggingface-hub": "1.33.0",
    "numpy": "2.5.2",
    "safetensors": "0.8.0",
    "sentencepiece": "0.2.2",
    "tiktoken": "0.14.0",
    "tokenizers": "0.23.2",
    "torch": "2.11.0",
    "torchaudio": "2.11.0",
    "torchvision": "0.26.0",
    "transformers": "5.17.0",
    "triton": "3.6.0",
    "xxhash": "4.0.1",
}
# Always taken from the image, whatever a pin says (too large to carry, or tied to the image's torch / CUDA).
KEEP_IMAGE_VERSION = {"torch", "triton", "numpy", "transformers", "tokenizers", "safetensors", "huggingface-hub",
                      "torchvision", "torchaudio", "accelerate", "scipy", "pillow", "sentencepiece", "tiktoken"}
NEVER_CARRY = {
    "torch": "the image's torch 2.11.0+cu130 is used",
    "triton": "the image's triton 3.6.0 is used",
    "numpy": "the image's numpy is used",
    "sgl-deep-gemm": "0.2.3.post2 does not load with torch 2.11 (undefined symbol)",
    "sglang-kernel": "~373 MB wheel built for torch 2.14.1",
    "sgl-kernel": "~373 MB wheel built for torch 2.14.1",
}

# Unpinned transitive dependencies taken at an older release that satisfies every requirement on them, to keep the
# folder small (used only while it does satisfy them): jedi 0.20 is 4.7 MB against 1.6 MB (IPython imports it only
# inside a try/except for completions), wcwidth >= 0.3 ships a 0.8 MB binary where 0.2.14 is pure Python.
PREFER = {"jedi": "0.19.2", "wcwidth": "0.2.14"}


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


IMAGE = {norm(n) for n in IMAGE_PACKAGES}


# --------------------------------------------------------------------------- versions and specifiers (PEP 440 subset)
_VERSION = re.compile(
    r"^\s*v?(?:(\d+)!)?(\d+(?:\.\d+)*)"
    r"(?:[-_.]?(a|b|c|rc|alpha|beta|pre|preview)[-_.]?(\d*))?"
    r"(?:-(\d+)|[-_.]?(post|rev|r)[-_.]?(\d*))?"
    r"(?:[-_.]?(dev)[-_.]?(\d*))?"
    r"(?:\+[a-z0-9]+(?:[-_.][a-z0-9]+)*)?\s*$",
    re.I,
)
_PRE_RANK = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2, "pre": 2, "preview": 2}


def vkey(text: str):
    m = _VERSION.match(text)
    if not m:
        return None
    release = [int(x) for x in m.group(2).split(".")]
    while len(release) > 1 and release[-1] == 0:
        release.pop()
    post = m.group(5) if m.group(5) is not None else (m.group(7) or "0") if m.group(6) else None
    dev = (m.group(9) or "0") if m.group(8) else None
    if m.group(3):
        pre = (1, _PRE_RANK[m.group(3).lower()], int(m.group(4) or 0))
    elif dev is not None and post is None:
        pre = (0,)
    else:
        pre = (2,)
    return (int(m.group(1) or 0), tuple(release), pre, -1 if post is None else int(post),
            (1,) if dev is None else (0, int(dev)))


def _release(text: str) -> list[int]:
    m = _VERSION.match(text)
    return [int(x) for x in m.group(2).split(".")] if m else []


def spec_ok(version: str, op: str, want: str) -> bool:
    if op == "===":
        return version == want
    if want.endswith(".*"):
        prefix = _release(want[:-2])
        have = _release(version) + [0] * len(prefix)
        hit = have[: len(prefix)] == prefix and (vkey(version) or (0,))[0] == (vkey(want[:-2]) or (0,))[0]
        return hit if op == "==" else not hit if op == "!=" else False
    a, b = vkey(version), vkey(want)
    if a is None or b is None:
        return False
    if op == "~=":
        rel = _release(want)[:-1] or _release(want)
        epoch = f"{b[0]}!" if b[0] else ""
        return a >= b and spec_ok(version, "==", epoch + ".".join(map(str, rel)) + ".*")
    same_base = a[:2] == b[:2]  # epoch and release
    if op == "<":  # <V excludes V's pre-releases unless V is one
        a_pre, b_pre = a[2] != (2,) or a[4] != (1,), b[2] != (2,) or b[4] != (1,)
        return a < b and not (same_base and a_pre and not b_pre)
    if op == ">":  # >V excludes V's post-releases unless V is one
        return a > b and not (same_base and a[3] >= 0 and b[3] < 0)
    return {"==": a == b, "!=": a != b, ">=": a >= b, "<=": a <= b}[op]


def parse_specs(text: str) -> list[tuple[str, str]]:
    out = []
    for part in text.split(","):
        part = part.strip()
        if part:
            m = re.match(r"^(===|==|!=|<=|>=|~=|<|>)\s*(\S+)$", part)
            if not m:
                raise ValueError(f"cannot parse version specifier {part!r}")
            out.append((m.group(1), m.group(2)))
    return out


def specs_ok(version: str, specs) -> bool:
    return all(spec_ok(version, op, want) for op, want in specs)


# --------------------------------------------------------------------------- PEP 508 markers (what metadata uses)
_MARKER_TOKEN = re.compile(
    r"\s*(\(|\)|===|==|!=|<=|>=|~=|<|>|not\s+in\b|in\b|and\b|or\b|not\b|'[^']*'|\"[^\"]*\"|[A-Za-z_][A-Za-z0-9_.]*)"
)
_VERSION_VARS = {"python_version", "python_full_version", "implementation_version"}


def marker_ok(marker: str, extras: frozenset[str]) -> bool:
    return any(_eval_marker(marker, extra) for extra in {""} | set(extras))


def _eval_marker(marker: str, extra: str) -> bool:
    tokens, pos = [], 0
    marker = marker.strip()
    while pos < len(marker):
        m = _MARKER_TOKEN.match(marker, pos)
        if not m:
            raise ValueError(f"cannot parse marker {marker!r}")
        tokens.append(re.sub(r"\s+", " ", m.group(1)))
        pos = m.end()
        while pos < len(marker) and marker[pos].isspace():
            pos += 1
    env = dict(TARGET_ENV, extra=extra)
    i = 0

    def value(tok):
        if tok[0] in "'\"":
            return tok[1:-1], False
        name = tok.replace("platform.python_implementation", "platform_python_implementation")
        name = {"os.name": "os_name", "sys.platform": "sys_platform", "platform.machine": "platform_machine",
                "platform.version": "platform_version", "python_implementation": "platform_python_implementation",
                }.get(name, name)
        if name not in env:
            raise ValueError(f"unknown marker variable {tok!r} in {marker!r}")
        return env[name], name

    def compare():
        nonlocal i
        lhs, lvar = value(tokens[i])
        op = tokens[i + 1]
        rhs, rvar = value(tokens[i + 2])
        i += 3
        if "extra" in (lvar, rvar):
            lhs, rhs = norm(lhs), norm(rhs)
        if op in ("in", "not in"):
            return (lhs in rhs) == (op == "in")
        if (lvar in _VERSION_VARS or rvar in _VERSION_VARS) and vkey(lhs) and vkey(rhs.rstrip(".*")):
            if rvar in _VERSION_VARS and lvar not in _VERSION_VARS:  # "3.8" < python_version
                flip = {"<": ">", ">": "<", "<=": ">=", ">=": "<="}
                lhs, rhs, op = rhs, lhs, flip.get(op, op)
            return spec_ok(lhs, op, rhs)
        if op == "==":
            return lhs == rhs
        if op == "!=":
            return lhs != rhs
        return spec_ok(lhs, op, rhs) if vkey(lhs) and vkey(rhs) else False

    def atom():
        nonlocal i
        if tokens[i] == "(":
            i += 1
            result = expr()
            i += 1  # ")"
            return result
        if tokens[i] == "not":
            i += 1
            return not atom()
        return compare()

    def conj():
        nonlocal i
        result = atom()
        while i < len(tokens) and tokens[i] == "and":
            i += 1
            result = atom() and result
        return result

    def expr():
        nonlocal i
        result = conj()
        while i < len(tokens) and tokens[i] == "or":
            i += 1
            result = conj() or result
        return result

    return expr()


# --------------------------------------------------------------------------- requirements
_REQ = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?\s*\(?([^;()@]*)\)?\s*(?:;\s*(.*))?$")


def parse_req(line: str):
    """(normalized name, extras, specs, marker) or None for a line that is not a plain requirement."""
    m = _REQ.match(line)
    if not m:
        raise ValueError(f"cannot parse requirement {line!r}")
    extras = frozenset(norm(e) for e in (m.group(2) or "").split(",") if e.strip())
    return norm(m.group(1)), extras, parse_specs(m.group(3) or ""), (m.group(4) or "").strip()


def requirement_file(path: Path) -> list[str]:
    out = []
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            out.append(line)
    return out


def plugin_requirements() -> tuple[list[str], str, str]:
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return list(project.get("dependencies", [])), norm(project["name"]), project["version"]


# --------------------------------------------------------------------------- wheels
_WHEEL_NAME = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(?:-\d[^-]*)?-[^-]+-[^-]+-[^-]+\.whl$")


def wheel_name_version(path: Path) -> tuple[str, str]:
    m = _WHEEL_NAME.match(path.name)
    if not m:
        raise ValueError(f"not a wheel file name: {path.name}")
    return norm(m.group("name")), m.group("version")


_metadata_cache: dict[Path, list[str]] = {}


def requires_dist(path: Path) -> list[str]:
    if path not in _metadata_cache:
        with zipfile.ZipFile(path) as zf:
            meta = [n for n in zf.namelist() if re.match(r"^[^/]+\.dist-info/METADATA$", n)]
            if len(meta) != 1:
                raise RuntimeError(f"{path.name}: expected one .dist-info/METADATA, found {meta}")
            text = zf.read(meta[0]).decode("utf-8", "replace")
        header = text.split("\n\n", 1)[0]
        _metadata_cache[path] = [ln.split(":", 1)[1].strip() for ln in header.splitlines()
                                 if ln.startswith("Requires-Dist:")]
    return _metadata_cache[path]


def pip_download(spec: str, dest: Path) -> Path:
    before = {p.name for p in dest.glob("*.whl")}
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
           "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp"]
    for plat in PLATFORMS:
        cmd += ["--platform", plat]
    cmd += ["-d", str(dest), spec]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        err = [ln for ln in (proc.stderr + proc.stdout).splitlines() if "is ignored: it is neither" not in ln]
        raise RuntimeError(f"pip download {spec!r} failed:\n" + "\n".join(err[-15:]))
    name = parse_req(spec)[0]
    new = [dest / n for n in {p.name for p in dest.glob("*.whl")} - before]
    new = [p for p in new if wheel_name_version(p)[0] == name]
    if not new:  # already there (pip re-used it): pick the one pip would have chosen
        new = [p for p in dest.glob("*.whl") if wheel_name_version(p)[0] == name
               and specs_ok(wheel_name_version(p)[1], parse_req(spec)[2])]
    if len(new) != 1:
        raise RuntimeError(f"pip download {spec!r}: expected one new wheel, got {[p.name for p in new]}")
    return new[0]


def record_line_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


_SLIM_DIRS = ("sglang/multimodal_gen/",)
_SLIM_RUST = re.compile(r"^sglang/srt/rust_extensions/_(server|grpc|bench|multimodal)\.[^/]*\.so$")


def _slim_drop(name: str) -> bool:
    return name.startswith(_SLIM_DIRS) or bool(_SLIM_RUST.match(name))


def is_slim(path: Path) -> bool:
    with zipfile.ZipFile(path) as zf:
        return not any(_slim_drop(n) for n in zf.namelist())


def slim_sglang(src: Path, dst: Path) -> dict:
    """Copy the wheel without the dropped paths and with a RECORD that lists exactly what remains."""
    dropped_rust = []
    with zipfile.ZipFile(src) as zin:
        infos = zin.infolist()
        names = [i.filename for i in infos]
        for ext in ("server", "grpc", "bench", "multimodal"):
            hits = [n for n in names if re.match(rf"^sglang/srt/rust_extensions/_{ext}\.[^/]*\.so$", n)]
            if len(hits) != 1:
                raise RuntimeError(f"{src.name}: expected one sglang/srt/rust_extensions/_{ext}.*.so, found {hits}")
            dropped_rust += hits
        if not any(n.startswith(_SLIM_DIRS[0]) for n in names):
            raise RuntimeError(f"{src.name}: no {_SLIM_DIRS[0]} to drop (wheel layout changed?)")
        if not any(re.match(r"^sglang/srt/mem_cache/rust_tree_core/mem_cache\.[^/]*\.so$", n) for n in names):
            raise RuntimeError(f"{src.name}: the radix-tree core extension is missing")
        record_name = [n for n in names if re.match(r"^sglang-[^/]+\.dist-info/RECORD$", n)]
        if len(record_name) != 1:
            raise RuntimeError(f"{src.name}: expected one RECORD, found {record_name}")
        kept = [i for i in infos if not _slim_drop(i.filename)]
        kept_names = {i.filename for i in kept}
        rows = list(csv.reader(io.StringIO(zin.read(record_name[0]).decode("utf-8"))))
        new_rows = [r for r in rows if r and r[0] in kept_names]
        listed = {r[0] for r in new_rows}
        record_hash = {r[0]: r[1] for r in new_rows if len(r) > 1 and r[1]}
        missing = [n for n in kept_names if n not in listed and not n.endswith("/")]
        if missing:
            raise RuntimeError(f"{src.name}: files not in RECORD: {missing[:5]}")
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows(new_rows)
        tmp = dst.with_name(dst.name + ".part")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zout:
            for info in kept:
                if info.filename == record_name[0]:
                    data = buf.getvalue().encode()
                else:
                    data = zin.read(info)
                    if info.filename in listed and record_hash.get(info.filename) != record_line_hash(data):
                        raise RuntimeError(f"{src.name}: {info.filename} does not match its RECORD hash")
                stored = info.compress_type == zipfile.ZIP_STORED
                zout.writestr(info, data, compress_type=zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED,
                              compresslevel=None if stored else 9)
    os.replace(tmp, dst)
    return {"dropped_files": len(infos) - len(kept), "dropped_rust": dropped_rust}


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = Path(base) / "sglang-glm-ext-carry"
    path.mkdir(parents=True, exist_ok=True)
    return path


def build_sglang(wheels: Path) -> tuple[Path, str]:
    have = [p for p in wheels.glob("sglang-*.whl") if wheel_name_version(p) == ("sglang", SGLANG_PIN)]
    cache = cache_dir()
    orig = [p for p in cache.glob(f"sglang-{SGLANG_PIN}-*.whl")]
    for p in have:
        if is_slim(p):
            before = f"{orig[0].stat().st_size / 2**20:.1f} MiB" if orig else "37.2 MiB"
            return p, (f"slimmed {before} -> {p.stat().st_size / 2**20:.1f} MiB (sglang/multimodal_gen/ and "
                       "rust_extensions/_server, _grpc, _bench, _multimodal dropped; re-used)")
    src = orig[0] if orig else pip_download(f"sglang=={SGLANG_PIN}", cache)
    for p in wheels.glob("sglang-*.whl"):
        p.unlink()
    dst = wheels / src.name
    info = slim_sglang(src, dst)
    return dst, (f"slimmed {src.stat().st_size / 2**20:.1f} MiB -> {dst.stat().st_size / 2**20:.1f} MiB: dropped "
                 f"{info['dropped_files']} files (sglang/multimodal_gen/, "
                 + ", ".join(Path(n).name for n in info["dropped_rust"]) + ")")


def build_plugin(wheels: Path, name: str) -> Path:
    """pip wheel --no-deps from a copy of the checkout's package sources (tracked and untracked-not-ignored)."""
    for p in wheels.glob(name.replace("-", "_") + "-*.whl"):
        p.unlink()
    try:
        listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
                                capture_output=True, check=True).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):
        listed = [str(p.relative_to(REPO)) for p in (REPO / "sglang_glm_ext").rglob("*") if p.is_file()]
        listed += ["pyproject.toml", "README.md"]
    keep = [f for f in listed if f and (f.startswith("sglang_glm_ext/") or "/" not in f and f in (
        "pyproject.toml", "README.md", "LICENSE", "setup.py", "setup.cfg", "MANIFEST.in"))]
    keep = [f for f in keep if (REPO / f).is_file() and "__pycache__" not in f and not f.endswith(".pyc")]
    with tempfile.TemporaryDirectory(prefix="glm-ext-wheel-") as tmp:
        src = Path(tmp) / "src"
        for f in keep:
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / f, src / f)
        out = Path(tmp) / "out"
        errors = []
        for python, isolation in _wheel_builders():
            cmd = [python, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps", "-w", str(out)]
            cmd += ([] if isolation else ["--no-build-isolation"]) + [str(src)]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            built = list(out.glob("*.whl"))
            if proc.returncode == 0 and len(built) == 1:
                dst = wheels / built[0].name
                shutil.move(str(built[0]), dst)
                return dst
            errors.append(f"{' '.join(cmd[:4])} ...: {(proc.stderr or proc.stdout).strip()[-800:]}")
        raise RuntimeError("could not build the plugin wheel:\n" + "\n".join(errors))


def _wheel_builders():
    """Interpreters able to build offline first (setuptools >= 70.1 ships bdist_wheel; older needs `wheel`)."""
    probe = ("import setuptools, sys\n"
             "v = tuple(int(x) for x in setuptools.__version__.split('.')[:2])\n"
             "if v < (70, 1):\n    import wheel\n"
             "sys.exit(0 if v >= (68, 0) else 1)\n")
    seen = []
    for python in (sys.executable, str(REPO / ".venv" / "bin" / "python")):
        if python in seen or not os.path.exists(python):
            continue
        seen.append(python)
        if subprocess.run([python, "-c", probe], capture_output=True).returncode == 0:
            yield python, False
    yield sys.executable, True  # build isolation: setuptools from the index (here, not on the lent machine)


# --------------------------------------------------------------------------- resolution
class Resolver:
    def __init__(self, wheels: Path):
        self.wheels = wheels
        self.chosen: dict[str, Path] = {}
        for p in wheels.glob("*.whl"):
            n, _ = wheel_name_version(p)
            if n != "sglang":
                self.chosen.setdefault(n, p)
        self.downloads = 0

    def walk(self, roots: list[tuple[str, str]]):
        """One pass over the closure of roots with the wheels chosen so far."""
        want: dict[str, dict] = {}
        image_use: dict[str, list[str]] = {}
        skipped: dict[str, list[str]] = {}
        expanded: dict[str, frozenset] = {}
        stack = [(line, origin) for line, origin in reversed(roots)]
        while stack:
            line, origin = stack.pop()
            name, extras, specs, marker = parse_req(line)
            if marker and not marker_ok(marker, frozenset()):
                continue
            spec_text = ",".join(op + v for op, v in specs) or "any"
            if name in NEVER_CARRY or (name.startswith("nvidia-") and name != "nvidia-ml-py"):
                skipped.setdefault(name, []).append(f"{spec_text} ({origin})")
                continue
            if name in IMAGE:
                known = IMAGE_VERSIONS.get(name)
                too_old = known is not None and any(op in ("==", ">=", ">", "~=", "===") and not v.endswith(".*")
                                                    and vkey(known) is not None and vkey(v) is not None
                                                    and vkey(known) < vkey(v) for op, v in specs)
                if not too_old or name in KEEP_IMAGE_VERSION:
                    image_use.setdefault(name, []).append((specs, f"{spec_text} ({origin})"))
                    continue
            entry = want.setdefault(name, {"specs": [], "extras": set(), "why": []})
            entry["specs"] += specs
            entry["extras"] |= extras
            if origin not in entry["why"]:
                entry["why"].append(origin)
            wheel = self.chosen.get(name)
            if wheel is None or not specs_ok(wheel_name_version(wheel)[1], entry["specs"]):
                continue  # fetched after this pass
            ex = frozenset(entry["extras"])
            if name in expanded and ex <= expanded[name]:
                continue
            expanded[name] = ex | expanded.get(name, frozenset())
            label = f"{name} {wheel_name_version(wheel)[1]}"
            for dep in requires_dist(wheel):
                dmarker = parse_req(dep)[3]
                if dmarker and not marker_ok(dmarker, expanded[name]):
                    continue
                stack.append((dep, label))
        return want, image_use, skipped

    def resolve(self, roots):
        for _ in range(30):
            want, image_use, skipped = self.walk(roots)
            todo = [(n, e) for n, e in want.items()
                    if n not in self.chosen or not specs_ok(wheel_name_version(self.chosen[n])[1], effective(n, e))]
            if not todo:
                return want, image_use, skipped
            for name, entry in todo:
                old = self.chosen.pop(name, None)
                specs = effective(name, entry)
                spec = name + ",".join(op + v for op, v in specs)
                reuse = [p for p in self.wheels.glob("*.whl") if wheel_name_version(p)[0] == name
                         and specs_ok(wheel_name_version(p)[1], specs)]
                if reuse:
                    self.chosen[name] = max(reuse, key=lambda p: vkey(wheel_name_version(p)[1]) or ())
                else:
                    print(f"  download {spec}", flush=True)
                    self.chosen[name] = pip_download(spec, self.wheels)
                    self.downloads += 1
                if old is not None and old != self.chosen[name] and old.exists():
                    old.unlink()
        raise RuntimeError("dependency resolution did not settle after 30 passes")


def effective(name: str, entry: dict) -> list[tuple[str, str]]:
    prefer = PREFER.get(name)
    if prefer and specs_ok(prefer, entry["specs"]):
        return entry["specs"] + [("==", prefer)]
    return entry["specs"]


def sglang_requirement_report(sglang_wheel: Path, carried: set[str]) -> list[str]:
    """sglang's own Requires-Dist (no extras) that neither the folder nor the image satisfies, or the image only
    at an unknown / older version."""
    lines = []
    for req in requires_dist(sglang_wheel):
        name, _, specs, marker = parse_req(req)
        if marker and not marker_ok(marker, frozenset()):
            continue
        spec_text = ",".join(op + v for op, v in specs)
        if name in carried:
            continue
        if name in IMAGE:
            known = IMAGE_VERSIONS.get(name)
            if specs and known and not specs_ok(known, specs):
                lines.append(f"  {name}{spec_text}: image has {known}")
            elif specs and not known:
                lines.append(f"  {name}{spec_text}: on the image, version not recorded (unverified)")
            continue
        why = NEVER_CARRY.get(name, "not carried (not on the server path this plugin uses)")
        lines.append(f"  {name}{spec_text}: absent; {why}")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=".gpucarry", help="folder to build, relative to the repository root")
    args = ap.parse_args()
    out = (REPO / args.out).resolve()
    wheels = out / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    for junk in wheels.glob("*.part"):
        junk.unlink()

    print(f"[build_carry] {out}", flush=True)
    sglang_wheel, sglang_note = build_sglang(wheels)
    print(f"  sglang: {sglang_wheel.name}: {sglang_note}", flush=True)

    plugin_deps, plugin_name, plugin_version = plugin_requirements()
    roots = []
    for rel in REQUIREMENT_FILES:
        roots += [(line, rel) for line in requirement_file(REPO / rel)]
    roots += [(line, "pyproject.toml (plugin)") for line in plugin_deps]
    pinned: dict[str, str] = {}
    for line, origin in roots:
        name, _, specs, _ = parse_req(line)
        for op, v in specs:
            if op == "==" and pinned.setdefault(name, v) != v:
                raise RuntimeError(f"{name} pinned twice: {pinned[name]} and {v}")
    resolver = Resolver(wheels)
    want, image_use, skipped = resolver.resolve(roots)

    plugin_wheel = build_plugin(wheels, plugin_name)
    print(f"  plugin: {plugin_wheel.name} (rebuilt)", flush=True)

    keep = {sglang_wheel, plugin_wheel} | {resolver.chosen[n] for n in want}
    for p in wheels.glob("*.whl"):
        if p not in keep:
            print(f"  remove {p.name} (no longer needed)")
            p.unlink()
    names = [wheel_name_version(p)[0] for p in wheels.glob("*.whl")]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise RuntimeError(f"more than one wheel of {dupes}")

    rows = [(sglang_wheel, f"SGLang {SGLANG_PIN} itself, {sglang_note}"),
            (plugin_wheel, f"this plugin ({plugin_name} {plugin_version}), built from the checkout")]
    for name in sorted(want):
        entry = want[name]
        why = "; ".join(entry["why"][:4]) + (f"; +{len(entry['why']) - 4} more" if len(entry["why"]) > 4 else "")
        if name in IMAGE:
            why = f"image has {IMAGE_VERSIONS[name]}, too old; " + why
        rows.append((resolver.chosen[name], "required by " + why))
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file() and p.name != "manifest.txt")

    lines = [f"# .gpucarry: wheels for SGLang {SGLANG_PIN}'s server + {plugin_name} on the lent GPU image "
             "(Python 3.12, torch 2.11.0+cu130, triton 3.6.0).",
             "# Built by scripts/gpu/build_carry.py; installed there by `source scripts/gpu/install_carry.sh`.",
             f"# {len(rows)} wheels", ""]
    width = max(len(p.name) for p, _ in rows)
    for p, why in sorted(rows, key=lambda r: -r[0].stat().st_size):
        lines.append(f"{p.name:<{width}}  {p.stat().st_size:>10,d} B  {p.stat().st_size / 2**20:6.2f} MiB  {why}")
    lines += ["", f"TOTAL {total:,d} bytes = {total / 2**20:.2f} MiB (limit {LIMIT_MIB:g} MiB, target "
              f"{TARGET_MIB:g} MiB)", "",
              "# Taken from the image (not carried), with what asked for them; version known = KINDS.md's pip list:"]
    for name in sorted(image_use):
        reqs = sorted({text for _, text in image_use[name]})
        known = IMAGE_VERSIONS.get(name)
        failing = sorted({text for specs, text in image_use[name] if known and not specs_ok(known, specs)})
        flag = f"  <-- image version does not satisfy {'; '.join(failing)}" if failing else ""
        lines.append(f"  {name} (image: {known or 'version not recorded'}): " + "; ".join(reqs[:5])
                     + (f"; +{len(reqs) - 5} more" if len(reqs) > 5 else "") + flag)
    lines += ["", "# Never carried:"]
    for name in sorted(skipped):
        lines.append(f"  {name}: {NEVER_CARRY.get(name, 'CUDA runtime package from the image')}; asked by "
                     + "; ".join(sorted(set(skipped[name]))[:3]))
    lines += ["", f"# sglang {SGLANG_PIN} Requires-Dist (no extra) not satisfied here, or on the image only at "
              "another or an unrecorded version:"] + sglang_requirement_report(sglang_wheel, set(want) | {plugin_name})
    (out / "manifest.txt").write_text("\n".join(lines) + "\n")
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())

    print(f"  {len(rows)} wheels ({resolver.downloads} downloaded this run); manifest: {out / 'manifest.txt'}")
    for name in sorted(image_use):
        known = IMAGE_VERSIONS.get(name)
        failing = sorted({text for specs, text in image_use[name] if known and not specs_ok(known, specs)})
        if failing:
            print(f"  WARNING: the image's {name} {known} does not satisfy {'; '.join(failing)} (taken anyway)")
    print(f"[build_carry] total {total / 2**20:.2f} MiB ({total:,d} bytes) in {out}")
    if total > LIMIT_MIB * 2**20:
        print(f"[build_carry] FAIL: over the {LIMIT_MIB:g} MiB limit", file=sys.stderr)
        return 1
    if total > TARGET_MIB * 2**20:
        print(f"[build_carry] warning: over the {TARGET_MIB:g} MiB target")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (RuntimeError, ValueError) as exc:
        print(f"[build_carry] FAIL: {exc}", file=sys.stderr)
        sys.exit(1)
