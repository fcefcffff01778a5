"""served.py without SGLang: the server's whole process group is stopped (children included), a dead or slow
server fails wait_ready with its log instead of hanging, and the metrics / percentile helpers."""

import os
import sys
import time

import pytest

from sglang_glm_ext.cpu_serve import served

CHILD = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']);"
         " print(p.pid, flush=True); time.sleep(300)")


class FakeServer(served.Server):
    def __init__(self, code, log):
        super().__init__("unused", log)
        self.code = code

    def command(self):
        return [sys.executable, "-c", self.code]


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] != "Z"


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_stop_and_kill_end_the_whole_process_group(tmp_path, how):
    log = str(tmp_path / "s.log")
    srv = FakeServer(CHILD, log).start()
    deadline = time.monotonic() + 60  # a hang guard: the child's pid comes once two interpreters have started
    while not (text := open(log).read().strip()):
        assert time.monotonic() < deadline, "the fake server never printed its child's pid"
        time.sleep(0.1)
    child = int(text.split()[0])
    assert srv.alive() and _alive(child)
    getattr(srv, how)()
    assert not srv.alive() and not _alive(child)
    getattr(srv, how)()  # idempotent


def test_wait_ready_fails_with_the_log_when_the_server_dies_or_is_slow(tmp_path):
    srv = FakeServer("import sys; print('boom: bad flag'); sys.exit(3)", str(tmp_path / "a.log")).start()
    with pytest.raises(served.ServerError, match="(?s)exited .*code 3.*boom: bad flag"):
        srv.wait_ready(60)
    srv = FakeServer("import time; time.sleep(300)", str(tmp_path / "b.log")).start()
    try:
        t0 = time.monotonic()
        with pytest.raises(served.ServerError, match="not ready after 2 s"):  # the timeout's error, not an exit's
            srv.wait_ready(2)
        # It gave up at its own timeout instead of waiting for the server (300 s): 60 s is a hang guard, not a speed
        # claim (it takes about 3 s; a wait for the server would take 300).
        assert time.monotonic() - t0 < 60, "hang guard: wait_ready(2) waited for the server"
    finally:
        srv.stop()


def test_parse_metrics_sums_labels_and_skips_buckets():
    text = ('# HELP x y\nsglang:cp_l3_spill_pages_total{rank="0"} 3.0\nsglang:cp_l3_spill_pages_total{rank="1"} 2\n'
            'sglang:ttft_bucket{le="1"} 9\nsglang:ttft_sum 1.5\n')
    assert served.parse_metrics(text) == {"sglang:cp_l3_spill_pages_total": 5.0, "sglang:ttft_sum": 1.5}
    assert served.median([3, 1, 2]) == 2 and served.median([1, 2, 3, 4]) == 2.5
    assert served.percentile([1, 2, 3, 4, 5], 0.9) == pytest.approx(4.6)


BIND_ERROR = ("import sys, time; print(\"ERROR:    [Errno 98] error while attempting to bind on address "
              "('127.0.0.1', %d): address already in use\", flush=True); time.sleep(900)")


def test_a_port_taken_before_the_bind_is_seen_at_once_and_start_ready_takes_another(tmp_path, monkeypatch):
    """SGLang 0.5.23 logs uvicorn's bind error and hangs in shutdown: wait_ready names it within seconds (not after
    its timeout), and start_ready starts again on a fresh port (a CI run lost two server tests to this race)."""
    log = str(tmp_path / "p.log")
    srv = FakeServer("", log)
    srv.code = BIND_ERROR % srv.port
    srv.start()
    try:
        t0 = time.monotonic()
        with pytest.raises(served.PortInUse, match=f"port {srv.port} was taken"):
            srv.wait_ready(600)
        # Named at the first look at the log (once a second), not at the timeout: a wait_ready that only noticed
        # the bind error when giving up would take 600 s; 60 s leaves any loaded machine a wide margin.
        assert time.monotonic() - t0 < 60, "the bind error was not seen before wait_ready's timeout"
    finally:
        srv.stop()

    ports = []

    class Retried(FakeServer):
        def command(self):
            ports.append(self.port)
            return [sys.executable, "-c", BIND_ERROR % self.port]

    srv = Retried("", str(tmp_path / "q.log"))
    with pytest.raises(served.PortInUse):
        srv.start_ready(120, attempts=2)
    assert len(ports) == 2 and ports[0] != ports[1] and not srv.alive()
