"""`-m server`: SGLang's real HTTP server on this CPU with the plugin (SGLANG_GLM_EXT_CPU_SERVE=1), a tiny GLM-5.

Time budget: about 15 minutes on 2 shared cores (each server start is 40-90 s; every scenario starts its servers
once, in a module fixture). Every wait is bounded (server start SERVER_TIMEOUT, each request REQUEST_TIMEOUT, each
test a pytest-timeout), so a hung server fails the test instead of hanging CI; every server is stopped (its whole
process group) when its fixture ends, whatever happened. `-m "not server"` leaves them out.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from sglang_glm_ext.cpu_serve import run, served, tiny_model

SERVER_TIMEOUT = 480.0
REQUEST_TIMEOUT = 240.0
PAGE = 64


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/server/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.server)
            item.add_marker(pytest.mark.slow)  # the quick lane (-m "not slow") never starts a server


@pytest.fixture(scope="session")
def glm5_model(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("glm5") / "model")
    tiny_model.write("glm5", path)
    return path


@pytest.fixture(scope="session", autouse=True)
def _torch_extensions():
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(os.getcwd(), ".torch_extensions"))


def l3_config(directory: str, *, budget: str = "256MiB", disk: str | None = None, extra: str = "") -> str:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "l3.toml")
    with open(path, "w") as f:
        f.write(f'''deployment_id = "server-tests"
cold_start = "load"
{extra}
[[disks]]
path = "{disk or os.path.join(directory, 'disk0')}"
budget = "{budget}"

[index]
path = "{os.path.join(directory, 'index')}"
map_size = "64MiB"

[queues]
staging_bytes = "16MiB"
''')
    return path


def l3_args(cfg: str) -> tuple[str, ...]:
    return (*served.HICACHE_ARGS, "--enable-metrics", "--enable-cp-l3", "--cp-l3-config", cfg)


def start(model: str, log: str, args=(), env=None) -> served.Server:
    srv = served.Server(model, log, args=args, env=env or {})
    try:
        srv.start_ready(SERVER_TIMEOUT)
    except BaseException:
        srv.stop()
        raise
    return srv


def send_all(srv: served.Server, reqs) -> list[served.Reply]:
    return [served.chat(srv.url, m, timeout=REQUEST_TIMEOUT) for m in reqs]


def fsck(cfg: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "sglang_glm_ext.cli", "l3", "fsck", "--json", cfg],
                          capture_output=True, text=True, timeout=300)
    return {**json.loads(proc.stdout), "rc": proc.returncode}


def loaded_at_attach(log_path: str) -> int | None:
    """The backend's own count of pages loaded by cold_start=load (its attach log line)."""
    with open(log_path, errors="replace") as f:
        m = re.findall(r"cold_start=load \((\d+) pages loaded\)", f.read())
    return int(m[-1]) if m else None


def pools_at_attach(log_path: str) -> int:
    with open(log_path, errors="replace") as f:
        m = re.findall(r"L3 backend attached: .*?pools (\{[^}]*\})", f.read())
    return len(m[-1].split(":")) - 1 if m else 0


def workload(conversations=2, turns=2, **kw):
    return run.workload(conversations, turns, **kw)
