"""Rank processes that start from an already-imported parent: a zygote imports SGLang (torch, the modules a rank
needs) ONCE, then forks each rank of a multi-process test from that state.

Why: every gloo rank of the multi-process tests (tests/l3/demo/test_cp_ranks.py, tests/regression/
test_cp_moe_gather_uneven_shards.py, tests/megamoe/test_miss_path.py, ...) used to be ``python -m ...`` of its own,
importing torch and SGLang again: ~10 s of CPU per rank, minutes on a loaded 2-core machine. A fork of a process that
has imported them starts in milliseconds.

What stays real: each rank is a separate OS process (its own pid, address space, gloo sockets; SIGKILL kills it and
nothing else), it runs its script or module as ``__main__`` with its own argv, environment, working directory and
log file, and its exit status is its own (a signal reads as -signum, as with ``subprocess``). What is shared is only
what the zygote imported before the fork. A module is preloaded only if importing it reads nothing a rank sets
(rank-specific environment, fakes put in ``sys.modules``): the caller chooses the list.

Bounded: ``Rank.wait(timeout)`` raises ``TimeoutError`` (the test fails, the ranks are killed); the zygote kills
every rank it forked and exits when its stdin closes (the test ended, or pytest died).

Use (a module-scoped fixture typically)::

    with Zygote(["torch", "sglang.srt.plugins"], env=env, cwd=REPO) as z:
        ranks = [z.spawn(module="sglang_glm_ext.l3.demo.cp_ranks", argv=[plan, str(r)], log=out / f"log{r}")
                 for r in range(world)]
        for r in ranks:
            r.wait(300)
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time

__all__ = ["Zygote", "Rank", "Completed"]

# ---------------------------------------------------------------------------------------------- the zygote process


def _child(req: dict) -> None:
    """In the forked rank: become the requested program; never returns."""
    code = 1
    try:
        os.setpgid(0, 0)  # its own process group: a kill of the rank never reaches the zygote or its siblings
        for target, path in ((1, req["log"]), (2, req.get("err") or req["log"])):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(fd, target)
            os.close(fd)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        sys.stdin = open(0, closefd=False)
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        os.environ.clear()
        os.environ.update(req["env"])
        os.chdir(req["cwd"])
        signal.signal(signal.SIGINT, signal.default_int_handler)
        import runpy

        if req.get("module"):
            sys.argv = [req["module"], *req["argv"]]
            runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
        elif req.get("code") is not None:  # python -c CODE
            sys.argv = ["-c", *req["argv"]]
            sys.path.insert(0, "")
            exec(compile(req["code"], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        else:
            sys.argv = [req["path"], *req["argv"]]
            sys.path.insert(0, os.path.dirname(os.path.abspath(req["path"])))
            runpy.run_path(req["path"], run_name="__main__")
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int) and e.code is not None:
            print(e.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - the rank's failure goes to its log and its exit status
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _forked_cuda_is_poisoned() -> bool:
    """Would a rank forked now fail with "Cannot re-initialize CUDA in forked subprocess"? A GPU is there and a
    forked probe finds torch's fork poison armed: ``torch.cuda.is_initialized()`` is not the answer, for
    ``torch.cuda.device_count()`` (which SGLang's imports call on a GPU machine) arms it without initializing CUDA
    (seen on the lent H200). Without a GPU a forked rank never reaches CUDA, armed or not: ranks fork."""
    torch = sys.modules.get("torch")
    if torch is None or not getattr(torch.version, "cuda", None) or torch.cuda.device_count() == 0:
        return False
    pid = os.fork()
    if pid == 0:
        os._exit(1 if torch.cuda._is_in_bad_fork() else 0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) != 0


def _serve(preload: list[str]) -> None:
    """The zygote: import ``preload``, say READY, then fork a rank per request line on stdin; report each rank's pid
    and exit status on stdout. Single-threaded (forking a multi-threaded process is unsafe): one select loop that
    also reaps exited ranks."""
    t0 = time.monotonic()
    import importlib

    for name in preload:
        importlib.import_module(name)
    out = os.fdopen(os.dup(1), "w", buffering=1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # what a preloaded module prints later never mixes into the protocol
    # CUDA touched by an import (SGLang on a GPU machine asks the device at import) does not survive a fork: the
    # test's side then starts each rank as a fresh interpreter instead (Zygote.spawn).
    cuda = _forked_cuda_is_poisoned()
    out.write(json.dumps({"ready": round(time.monotonic() - t0, 2), "pid": os.getpid(), "cuda": cuda}) + "\n")
    children: set[int] = set()
    buf = b""
    open_ = True
    try:
        while open_ or children:
            if open_:
                r, _, _ = select.select([0], [], [], 0.05)
                if r:
                    chunk = os.read(0, 65536)
                    if not chunk:
                        open_ = False
                        for pid in children:  # the test is gone: no rank outlives it
                            _kill_group(pid)
                    buf += chunk
                    while b"\n" in buf:
                        line, buf = buf.split(b"\n", 1)
                        req = json.loads(line)
                        pid = os.fork()
                        if pid == 0:
                            out.close()
                            _child(req)
                        try:
                            os.setpgid(pid, pid)  # also here: a kill right after the fork must reach its group
                        except OSError:
                            pass
                        children.add(pid)
                        out.write(json.dumps({"id": req["id"], "pid": pid}) + "\n")
            else:
                time.sleep(0.05)
            while children:
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    children.clear()
                    break
                if pid == 0:
                    break
                children.discard(pid)
                out.write(json.dumps({"exit": pid, "code": os.waitstatus_to_exitcode(status)}) + "\n")
    finally:
        for pid in children:
            _kill_group(pid)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


# ---------------------------------------------------------------------------------------------- the test's side


class Rank:
    """A forked rank, used like ``subprocess.Popen``: ``pid``, ``poll()``, ``wait(timeout)``, ``kill()``,
    ``returncode`` (negative: killed by that signal)."""

    def __init__(self, zygote: "Zygote", pid: int, log: str):
        self._z, self.pid, self.log = zygote, pid, log
        self.returncode: "int | None" = None

    def poll(self) -> "int | None":
        self._z._pump(0)
        return self.returncode

    def wait(self, timeout: "float | None" = None) -> int:
        """The exit status; ``TimeoutError`` when the rank has not exited within ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"rank pid {self.pid} did not exit within {timeout} s")
            self._z._pump(0.1 if left is None else min(left, 0.1))
        return self.returncode

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the rank (its process group: whatever it started goes too); a no-op once it exited."""
        if self.returncode is None:
            try:
                os.killpg(self.pid, sig)
            except ProcessLookupError:
                pass

    def send_signal(self, sig: int) -> None:
        self.kill(sig)

    def read_log(self) -> str:
        try:
            with open(self.log, errors="replace") as f:
                return f.read()
        except OSError:
            return ""


class _FreshRank(Rank):
    """A rank started as a fresh interpreter (``rank_zygote.py --run REQUEST``), where the zygote cannot fork one."""

    def __init__(self, proc: subprocess.Popen, log: str):
        self.proc, self.pid, self.log = proc, proc.pid, log
        self.returncode: "int | None" = None

    def poll(self) -> "int | None":
        self.returncode = self.proc.poll()
        return self.returncode

    def wait(self, timeout: "float | None" = None) -> int:
        try:
            self.returncode = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"rank pid {self.pid} did not exit within {timeout} s") from None
        return self.returncode

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.poll() is None:
            try:
                os.killpg(self.pid, sig)
            except ProcessLookupError:
                pass


class Completed:
    """What :meth:`Zygote.run` returns: ``returncode``, ``stdout``, ``stderr`` (text), as ``CompletedProcess``."""

    def __init__(self, returncode: int, stdout: str, stderr: str):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


class Zygote:
    """A zygote process (``python rank_zygote.py MODULE...``) with ``env`` and ``cwd``; ``spawn`` forks a rank.

    ``start_timeout`` bounds the imports (a loaded machine: minutes); past it, or if the zygote dies, ``Zygote``
    raises ``RuntimeError`` with its stderr."""

    def __init__(self, preload: list[str], *, env: "dict | None" = None, cwd: "str | None" = None,
                 start_timeout: float = 600.0):
        self.env = dict(os.environ if env is None else env)
        self.cwd = cwd or os.getcwd()
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), *preload], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=self.env, cwd=self.cwd)
        self._err: list[bytes] = []
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        self._ranks: dict[int, Rank] = {}
        self._exits: dict[int, int] = {}
        self._replies: dict[int, int] = {}
        self._buf = b""
        self._next = 0
        self._lock = threading.Lock()
        msg = self._read_line(start_timeout)
        if msg is None or "ready" not in msg:
            self.close()
            raise RuntimeError(f"the rank zygote did not start ({msg}): {b''.join(self._err)[-4000:].decode()}")
        self.import_s = msg["ready"]
        self.cuda = bool(msg.get("cuda"))  # its imports made a CUDA context: ranks start fresh (see _serve)

    def _drain_stderr(self) -> None:
        for line in self.proc.stderr:
            self._err.append(line)

    def _read_line(self, timeout: float) -> "dict | None":
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            r, _, _ = select.select([fd], [], [], left)
            if not r:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def _pump(self, timeout: float) -> None:
        """Read what the zygote said (pids, exits) for up to ``timeout`` seconds."""
        with self._lock:
            msg = self._read_line(timeout)
            while msg is not None:
                if "exit" in msg:
                    rank = self._ranks.get(msg["exit"])
                    if rank is not None:
                        rank.returncode = msg["code"]
                    else:
                        self._exits[msg["exit"]] = msg["code"]
                elif "id" in msg:
                    self._replies[msg["id"]] = msg["pid"]
                msg = self._read_line(0) if b"\n" in self._buf else None
            if self.proc.poll() is not None:
                for rank in self._ranks.values():
                    if rank.returncode is None and not isinstance(rank, _FreshRank):  # a fresh one is not its child
                        rank.returncode = -signal.SIGKILL  # the zygote died: its process group went with it

    def spawn(self, *, argv: list[str] = (), log, err=None, module: "str | None" = None, path: "str | None" = None,
              code: "str | None" = None, env: "dict | None" = None, cwd: "str | None" = None) -> Rank:
        """Fork a rank running ``module`` (``python -m``), the script ``path`` or ``code`` (``python -c``) with
        ``argv``; its stdout goes to ``log``, its stderr to ``err`` (default: ``log`` too); ``env`` replaces the
        zygote's environment for it (default: the zygote's)."""
        assert sum(x is not None for x in (module, path, code)) == 1, "one of module / path / code"
        self._next += 1
        req = {"id": self._next, "module": module, "path": path and str(path), "code": code,
               "argv": [str(a) for a in argv], "log": str(log), "err": err and str(err),
               "env": dict(self.env if env is None else env), "cwd": str(cwd or self.cwd)}
        if self.cuda:
            proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--run", json.dumps(req)],
                                    stdin=subprocess.DEVNULL, env=req["env"], cwd=req["cwd"], process_group=0)
            rank = self._ranks[proc.pid] = _FreshRank(proc, str(log))
            return rank
        self.proc.stdin.write((json.dumps(req) + "\n").encode())
        self.proc.stdin.flush()
        deadline = time.monotonic() + 60
        while req["id"] not in self._replies:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"the rank zygote did not fork: {b''.join(self._err)[-4000:].decode()}")
            self._pump(0.1)
        pid = self._replies.pop(req["id"])
        rank = self._ranks[pid] = Rank(self, pid, str(log))
        if pid in self._exits:
            rank.returncode = self._exits.pop(pid)
        return rank

    def run(self, *, timeout: float, **spawn) -> "Completed":
        """Like ``subprocess.run(..., capture_output=True, text=True, timeout=...)`` for one forked process:
        ``spawn``'s arguments but the log files; ``TimeoutError`` (the process killed) past ``timeout``."""
        import tempfile

        with tempfile.TemporaryDirectory(prefix="zygote-run-") as d:
            out, err = os.path.join(d, "stdout"), os.path.join(d, "stderr")
            rank = self.spawn(log=out, err=err, **spawn)
            try:
                rank.wait(timeout)
            finally:
                rank.kill()
            with open(out, errors="replace") as fo, open(err, errors="replace") as fe:
                return Completed(rank.returncode, fo.read(), fe.read())

    def close(self) -> None:
        """Kill every rank still running and stop the zygote."""
        for rank in self._ranks.values():
            rank.kill()
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> "Zygote":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--run"]:  # one rank in a fresh interpreter (a zygote that holds a CUDA context)
        _child(json.loads(sys.argv[2]))
    _serve(sys.argv[1:])
