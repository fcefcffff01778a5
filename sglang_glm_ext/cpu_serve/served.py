"""A real SGLang server as a child process, and an OpenAI-compatible client for it (standard library only).

Used by the main job (``run.py``), the ``-m server`` tests and ``benchmark/cpu_server_bench.py``:

* :class:`Server` starts ``python -m sglang.launch_server`` in its own process group (``start_new_session``), its
  output in a log file, and stops the whole group on every exit path (``stop``: SIGTERM, then SIGKILL after a
  grace period; ``kill``: SIGKILL at once, for crash tests). ``wait_ready`` polls ``/health`` with a finite
  timeout, shows progress, and fails with the log's tail when the server dies or does not come up.
* :func:`chat` sends one ``/v1/chat/completions`` request (streamed, greedy) and returns what the comparisons need:
  SGLang's own ``cached_tokens_details`` (device / host / storage) and output token ids (``sglext``), plus the
  client-side time to first token.
* :func:`scrape` reads ``/metrics`` (Prometheus text) into ``{name: summed value}``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

CPU_SERVE_ENV = {"SGLANG_GLM_EXT_CPU_SERVE": "1", "SGLANG_USE_CPU_ENGINE": "1"}

# SGLang's own flags for a CPU server of a tiny model (cpu_server_0523.md): dummy weights, the torch attention
# backend, a small static KV pool, no CUDA graphs. float32 compute (the GLM-5 KV cache stays bf16: SGLang's DSA
# resolution allows only bf16 / fp8 there): in bf16 a prefix hit and a cold prefill of the same prompt differ in
# reduction order enough to flip near-tie greedy tokens of a random model (seen here: 1 of 4 requests), in float32
# they gave the same ids on every workload tried, so replays can be compared with a cold reference.
CPU_BASE_ARGS = ("--device", "cpu", "--attention-backend", "torch_native", "--load-format", "dummy", "--dtype", "float32",
                 "--mem-fraction-static", "0.05", "--max-total-tokens", "8192", "--disable-cuda-graph",
                 "--page-size", "64")
HICACHE_ARGS = ("--enable-hierarchical-cache", "--hicache-ratio", "2", "--hicache-io-backend", "direct",
                "--hicache-mem-layout", "layer_first", "--hicache-write-policy", "write_through",
                "--hicache-storage-prefetch-policy", "wait_complete")


class ServerError(RuntimeError):
    """The server died, did not come up in time, or answered a request with an error."""


class PortInUse(ServerError):
    """The server could not bind its port: another process took it between :func:`free_port` and the bind (SGLang
    binds its HTTP port only after loading the model, and its own workers pick free ports meanwhile). SGLang 0.5.23
    then logs uvicorn's error and waits for shutdown instead of exiting, so this is read from the log."""


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    """One ``sglang.launch_server`` child. Use as a context manager, or call :meth:`stop` in a ``finally``."""

    model: str
    log_path: str
    args: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    # What every server of a kind gets: the CPU serving mode's by default (the GPU served run passes its own).
    base_args: Sequence[str] = CPU_BASE_ARGS
    base_env: Mapping[str, str] = field(default_factory=lambda: dict(CPU_SERVE_ENV))
    port: int = 0
    python: str = sys.executable
    proc: subprocess.Popen | None = None

    def __post_init__(self):
        self.port = self.port or free_port()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [self.python, "-m", "sglang.launch_server", "--model-path", self.model, "--host", "127.0.0.1",
                "--port", str(self.port), *self.base_args, *self.args]

    def start(self) -> "Server":
        env = {**os.environ, **self.base_env, **self.env}
        env.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(os.getcwd(), ".torch_extensions"))
        os.makedirs(os.path.dirname(os.path.abspath(self.log_path)), exist_ok=True)
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=env,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            log.close()
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 25) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 64 * 1024))
                text = f.read().decode(errors="replace")
        except OSError:
            return ""
        keep = [ln for ln in text.splitlines() if "Ignore import error" not in ln]
        return "\n".join(keep[-lines:])

    def wait_ready(self, timeout: float = 300.0, progress: Callable[[str], None] | None = None,
                   every: float = 15.0) -> float:
        """Seconds until ``/health`` answered 200; ServerError when the process exits or ``timeout`` passes."""
        t0 = time.monotonic()
        last_note = t0
        while True:
            if not self.alive():
                raise ServerError(f"the server exited (code {self.proc.returncode if self.proc else None}) before "
                                  f"it was ready; log {self.log_path}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return time.monotonic() - t0
            except (urllib.error.URLError, OSError, ValueError):
                pass
            if f"attempting to bind on address ('127.0.0.1', {self.port})" in self.log_tail(40):
                raise PortInUse(f"port {self.port} was taken before the server bound it; log {self.log_path}:\n"
                                f"{self.log_tail()}")
            now = time.monotonic()
            if now - t0 > timeout:
                raise ServerError(f"the server was not ready after {timeout:.0f} s; log {self.log_path}:\n"
                                  f"{self.log_tail()}")
            if progress is not None and now - last_note >= every:
                last_note = now
                tail = self.log_tail(1).strip()[-110:]
                progress(f"  ... server starting ({now - t0:.0f} s): {tail}")
            time.sleep(1.0)

    def start_ready(self, timeout: float = 300.0, progress: Callable[[str], None] | None = None,
                    attempts: int = 3) -> float:
        """:meth:`start`, then :meth:`wait_ready`; a port another process took meanwhile (:class:`PortInUse`) is
        given up for a fresh one, up to ``attempts`` starts. Seconds the last start took to be ready."""
        for k in range(attempts):
            self.start()
            try:
                return self.wait_ready(timeout, progress)
            except PortInUse:
                self.stop()
                if k == attempts - 1:
                    raise
                self.port = free_port()
                if progress is not None:
                    progress(f"  ... its port was taken meanwhile: starting again on port {self.port}")
        raise AssertionError("unreachable")  # pragma: no cover

    def _signal_group(self, sig) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM the server's process group, then SIGKILL what is left after ``grace`` seconds. Idempotent."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        self._signal_group(signal.SIGKILL)  # children (scheduler, detokenizer) may outlive the parent
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        _wait_group_gone(self.proc.pid, 10)

    def kill(self) -> None:
        """SIGKILL the whole process group at once (a crash, not a shutdown)."""
        if self.proc is None:
            return
        self._signal_group(signal.SIGKILL)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        _wait_group_gone(self.proc.pid, 10)

    def __enter__(self) -> "Server":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _wait_group_gone(pgid: int, timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.2)


# ---------------------------------------------------------------------------------------------- client
@dataclass
class Reply:
    prompt_tokens: int
    output_ids: list[int]
    cached: dict[str, int]  # device / host / storage (SGLang's cached_tokens_details; missing tiers are 0)
    ttft_s: float
    e2e_s: float

    @property
    def cached_total(self) -> int:
        return sum(self.cached.values())


def _find(obj: Any, key: str) -> Any:
    if isinstance(obj, dict):
        if key in obj and obj[key] is not None:
            return obj[key]
        for v in obj.values():
            got = _find(v, key)
            if got is not None:
                return got
    elif isinstance(obj, list):
        for v in obj:
            got = _find(v, key)
            if got is not None:
                return got
    return None


def chat(url: str, messages: Sequence[Mapping[str, str]], *, max_tokens: int = 8, timeout: float = 180.0) -> Reply:
    """One greedy, streamed chat completion; every reply is exactly ``max_tokens`` long (``ignore_eos``)."""
    body = {"model": "default", "messages": list(messages), "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True,
            "return_cached_tokens_details": True, "return_output_ids_in_sglext": True}
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    t0 = time.monotonic()
    ttft = None
    chunks: list[dict] = []
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            for raw in resp:
                line = raw.decode(errors="replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                try:
                    chunk = json.loads(data)
                except ValueError:
                    continue
                if "error" in chunk:
                    raise ServerError(f"the server answered with an error: {chunk['error']}")
                if ttft is None and _find(chunk.get("choices") or [], "content"):
                    ttft = time.monotonic() - t0
                chunks.append(chunk)
    except urllib.error.HTTPError as exc:
        raise ServerError(f"HTTP {exc.code}: {exc.read()[:500]!r}") from None
    e2e = time.monotonic() - t0
    usage = next((c["usage"] for c in reversed(chunks) if c.get("usage")), {}) or {}
    out = _find(chunks, "output_ids")
    details = _find(chunks, "cached_tokens_details") or {}
    cached = {k: int(details.get(k) or 0) for k in ("device", "host", "storage")}
    ids = list(out[0]) if out and isinstance(out[0], list) else list(out or [])
    return Reply(int(usage.get("prompt_tokens", 0)), ids, cached, ttft if ttft is not None else e2e, e2e)


# ---------------------------------------------------------------------------------------------- metrics
def scrape_text(url: str, timeout: float = 30.0) -> str:
    """The server's ``/metrics`` page, as text."""
    with urllib.request.urlopen(url + "/metrics", timeout=timeout) as r:
        return r.read().decode(errors="replace")


def scrape(url: str, timeout: float = 30.0) -> dict[str, float]:
    """``/metrics`` as ``{metric name: value summed over labels}`` (histogram buckets left out)."""
    return parse_metrics(scrape_text(url, timeout))


def parse_metrics(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, _, value = line.rpartition(" ")
        name = name_labels.split("{", 1)[0]
        if name.endswith("_bucket"):
            continue
        try:
            out[name] = out.get(name, 0.0) + float(value)
        except ValueError:
            continue
    return out


def wait_counter_settled(url: str, name: str, *, quiet: float = 3.0, timeout: float = 120.0) -> float:
    """Poll ``name`` until it has not risen for ``quiet`` seconds (the write-back drained); its value. ServerError
    after ``timeout``."""
    t0 = time.monotonic()
    last = scrape(url).get(name, 0.0)
    still_since = time.monotonic()
    while True:
        time.sleep(0.5)
        now_val = scrape(url).get(name, 0.0)
        if now_val != last:
            last, still_since = now_val, time.monotonic()
        elif time.monotonic() - still_since >= quiet:
            return now_val
        if time.monotonic() - t0 > timeout:
            raise ServerError(f"{name} still rising after {timeout:.0f} s (last {last})")


def median(values: Iterable[float]) -> float:
    vals = sorted(values)
    if not vals:
        return float("nan")
    mid = len(vals) // 2
    return vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2


def percentile(values: Iterable[float], q: float) -> float:
    vals = sorted(values)
    if not vals:
        return float("nan")
    k = (len(vals) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(vals) - 1)
    return vals[lo] + (vals[hi] - vals[lo]) * (k - lo)
