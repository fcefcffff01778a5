"""disk/probe.py: every directory the L3 engine writes in is proven before the model loads, by creating and writing
there in miniature, and each bad path kind is refused in one line naming its key and the fix.

The permission cases cannot be judged as root (root writes anywhere; ``os.access`` says yes to everything), and CI
runs as root: they run the probe in a forked child that has dropped to uid/gid 65534 (skipped, with the reason, only
where that drop is refused). The read-only case mounts a read-only tmpfs in a private mount namespace of a child
(skipped where that cannot be done).
"""

from __future__ import annotations

import errno
import os
import pickle
import shutil
import subprocess
import sys
import tempfile

import pytest

import l3kit
from sglang_glm_ext.l3.config import L3Config
from sglang_glm_ext.l3.disk import probe as probe_mod
from sglang_glm_ext.l3.disk.probe import PREFIX, fs_of, probe_config, probe_dir

NOBODY = 65534


def _leftovers(directory) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.startswith(PREFIX))


def _independent_o_direct(directory) -> int:
    """0 when an aligned O_DIRECT write works in ``directory``, else the errno that refused it."""
    import mmap

    path = os.path.join(directory, "own-odirect-probe")
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    try:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_DIRECT)
        except OSError as e:
            return e.errno
        try:
            os.pwrite(fd, mmap.mmap(-1, 4096), 0)
            return 0
        except OSError as e:
            return e.errno
        finally:
            os.close(fd)
    finally:
        os.unlink(path)


def _one_line(problem: str, key: str = "disks[0].path") -> None:
    """One line that starts with the config key and ends with a fix naming it; no Python repr of a path."""
    assert problem and "\n" not in problem and problem.startswith(f"{key} "), problem
    assert f"point {key} at" in problem.split("; ")[-1] or f"put {key} on" in problem, problem
    assert "'/" not in problem and "Errno" not in problem, problem


# ------------------------------------------------------------------------------------------------ usable paths
def test_an_existing_directory_is_written_and_left_as_it_was(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    slab = disk / "target_kv.slab"
    slab.write_bytes(b"s" * 8192)
    before = os.stat(slab)
    got = probe_dir("disks[0].path", str(disk))
    assert got.problem == "" and got.exists is True and got.free_bytes > 0
    want = _independent_o_direct(disk)
    if want in (0, errno.EINVAL):
        assert got.o_direct is (want == 0), got
    assert sorted(os.listdir(disk)) == ["target_kv.slab"]  # the probe file is gone
    after = os.stat(slab)
    assert slab.read_bytes() == b"s" * 8192 and (after.st_mtime_ns, after.st_ino) == (before.st_mtime_ns,
                                                                                       before.st_ino)


def test_missing_parents_are_proven_where_the_engine_would_create_them_and_nothing_stays(tmp_path):
    """The engine creates every missing directory of ``<disk>/<deployment>/rank<r>`` (owner-only): the probe
    creates the first missing level privately, writes there, and takes it back."""
    target = tmp_path / "not" / "yet" / "disk0"
    got = probe_dir("disks[0].path", str(target), str(target / "dep" / "rank0"))
    assert got.problem == "" and got.exists is False and got.o_direct is not None and got.free_bytes > 0
    assert os.listdir(tmp_path) == []  # nothing created, nothing left


def test_direct_io_off_writes_buffered_and_does_not_try_o_direct(tmp_path, monkeypatch):
    real_open = os.open
    tried = []

    def watching(path, flags, *a, **kw):
        tried.append(bool(flags & os.O_DIRECT))
        return real_open(path, flags, *a, **kw)

    monkeypatch.setattr(os, "open", watching)
    got = probe_dir("disks[0].path", str(tmp_path), direct="off")
    assert got.problem == "" and got.o_direct is None and not any(tried)


# ------------------------------------------------------------------------------------------------ bad paths
def test_a_path_under_a_regular_file_is_refused_naming_the_file(tmp_path):
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    got = probe_dir("disks[0].path", str(blocker / "disk0"), str(blocker / "disk0" / "dep" / "rank0"))
    _one_line(got.problem)
    assert f"{blocker} is not a directory" in got.problem and f"move {blocker} away" in got.problem
    assert blocker.read_text() == "x"


def test_a_path_that_is_a_regular_file_is_refused(tmp_path):
    f = tmp_path / "disk0"
    f.write_text("x")
    got = probe_dir("disks[0].path", str(f))
    _one_line(got.problem)
    assert "exists and is not a directory" in got.problem


@pytest.mark.parametrize("root, fs", [("/proc", "proc"), ("/sys", "sysfs")])
def test_a_path_on_a_kernel_file_system_is_refused_for_that_not_for_its_free_space(root, fs):
    if fs_of(root)[0] != fs:
        pytest.skip(f"{root} is not a {fs} mount here")
    got = probe_dir("index.path", f"{root}/glm-ext-l3-test")
    _one_line(got.problem, "index.path")
    assert f"kernel's {fs} file system" in got.problem and "free" not in got.problem
    assert not os.path.exists(f"{root}/glm-ext-l3-test")


def _as_unprivileged(fn, *args):
    """``fn(*args)`` run by uid/gid 65534: in a forked child that dropped root (this process keeps its uid), or here
    when this process is not root already. Skips only where the drop is refused."""
    if os.geteuid() != 0:
        return fn(*args)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop, run, send the result back, never return into pytest
        try:
            os.close(r)
            try:
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
            except OSError as exc:
                out = ("skip", f"cannot drop to uid {NOBODY}: {exc.strerror}")
            else:
                out = ("ok", fn(*args))
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            out = ("error", f"{type(exc).__name__}: {exc}")
        with os.fdopen(w, "wb") as f:
            f.write(pickle.dumps(out))
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    kind, value = pickle.loads(data)
    if kind == "skip":
        pytest.skip(value)
    assert kind == "ok", value
    return value


@pytest.fixture
def shared_dir():
    """A directory uid 65534 can reach (pytest's tmp_path lives under a 0700 directory of root's)."""
    d = tempfile.mkdtemp(prefix="glm-ext-probe-test-")
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_a_directory_the_serving_user_may_not_write_is_refused_even_when_run_as_root(shared_dir):
    """A missing disk path whose parent is another user's (0755): nothing can be created there."""
    got = _as_unprivileged(probe_dir, "disks[0].path", os.path.join(shared_dir, "l3", "disk0"))
    _one_line(got.problem)
    assert f"is not writable by uid {os.geteuid() if os.geteuid() else NOBODY}" in got.problem
    assert f"cannot create a file in {shared_dir}" in got.problem and "Permission denied" in got.problem
    assert os.listdir(shared_dir) == []


def test_a_read_only_directory_is_refused_even_when_run_as_root(shared_dir):
    """An existing disk path (0555, another user's): it cannot take a file, so no slab."""
    disk = os.path.join(shared_dir, "disk0")
    os.mkdir(disk, 0o555)
    os.chmod(disk, 0o555)
    try:
        got = _as_unprivileged(probe_dir, "disks[0].path", disk)
        _one_line(got.problem)
        assert "is not writable by uid" in got.problem and f"write access to {disk}" in got.problem
        assert os.listdir(disk) == []
    finally:
        os.chmod(disk, 0o755)


def test_the_launch_check_refuses_an_unwritable_disk_even_when_run_as_root(shared_dir):
    from sglang_glm_ext.declare import PluginFlagError
    from sglang_glm_ext.l3 import launch

    cfg = l3kit.write_config(shared_dir)  # the disk and the index to be created under shared_dir/l3
    home = os.path.join(shared_dir, "l3")
    os.chmod(cfg, 0o644)
    os.chmod(home, 0o555)  # readable, not writable: only root can create the disk there

    def check(path):
        try:
            launch.plan_launch(True, path)
        except PluginFlagError as exc:
            return str(exc)
        return ""

    try:
        refused = _as_unprivileged(check, cfg)
        assert refused.startswith(f"--cp-l3-config {cfg}: disks[0].path ") and "is not writable by uid" in refused
        assert "\n" not in refused and "point disks[0].path at a directory it owns" in refused
        if os.geteuid() == 0:
            assert check(cfg) == ""  # root may write there: the same check passes
        assert sorted(os.listdir(home)) == ["l3.toml"]  # neither check left anything
    finally:
        os.chmod(home, 0o755)


_RO_CHILD = """
import sys
sys.path[:0] = {paths!r}
from sglang_glm_ext.l3.disk.probe import probe_dir
print(probe_dir("disks[0].path", sys.argv[1] + "/disk0").problem)
"""


def test_a_read_only_file_system_is_refused(tmp_path):
    """A read-only tmpfs mounted in a private mount namespace (the mount never shows outside the child)."""
    mnt = tmp_path / "ro"
    mnt.mkdir()
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare(1) to mount a read-only file system in a private namespace")
    code = _RO_CHILD.format(paths=[p for p in sys.path if p])
    script = f'mount -t tmpfs -o ro,size=1m glm-ext-ro "$1" && exec "$2" -c "$3" "$1"'
    opts = ["-m", "--propagation", "private"] if os.geteuid() == 0 else ["-r", "-m", "--propagation", "private"]
    proc = subprocess.run([unshare, *opts, "sh", "-c", script, "sh", str(mnt), sys.executable, code],
                          capture_output=True, text=True, timeout=120)
    if proc.returncode != 0 and "Traceback" not in proc.stderr:
        pytest.skip(f"cannot mount a read-only tmpfs in a private namespace here: {proc.stderr.strip()[-300:]}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    problem = proc.stdout.strip()
    _one_line(problem)
    assert "is not writable: the file system at" in problem and "mounted read-only" in problem
    assert os.listdir(mnt) == []  # outside the namespace: no mount, nothing written


def test_direct_io_on_refuses_a_file_system_that_refuses_o_direct_and_auto_falls_back(tmp_path, monkeypatch):
    real_open = os.open

    def refusing(path, flags, *a, **kw):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *a, **kw)

    monkeypatch.setattr(os, "open", refusing)
    on = probe_dir("disks[0].path", str(tmp_path), direct="on")
    assert "refuses O_DIRECT writes" in on.problem and 'set direct_io = "auto"' in on.problem, on.problem
    auto = probe_dir("disks[0].path", str(tmp_path), direct="auto")
    assert auto.problem == "" and auto.o_direct is False and "fallback" in auto.o_direct_detail
    assert _leftovers(tmp_path) == []


def test_a_full_file_system_is_refused_with_the_key_and_the_fix(tmp_path, monkeypatch):
    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fdatasync", full)
    got = probe_dir("disks[0].path", str(tmp_path))
    _one_line(got.problem)
    assert "its file system is full" in got.problem and _leftovers(tmp_path) == []


# ------------------------------------------------------------------------------------------------ a whole config
def test_every_directory_of_a_config_is_probed_once_disks_first_then_the_index(tmp_path):
    d = l3kit.config_dict(tmp_path, budget=2**20, disks=[{"path": str(tmp_path / "d0"), "budget": 2**20},
                                                          {"path": str(tmp_path / "d1"), "budget": 2**20}])
    cfg = L3Config.from_dict({**d, "ranks": {"count": 4}})
    rank0 = cfg.slab_dir(0, 0)
    os.makedirs(rank0)  # rank 0's directory exists: it is probed itself; rank 2's is not, so its parent is
    got = probe_config(cfg)
    assert [(p.key, p.target) for p in got] == [
        ("disks[0].path", rank0), ("disks[0].path", cfg.slab_dir(2, 0)), ("disks[1].path", cfg.slab_dir(1, 1)),
        ("index.path", os.path.abspath(cfg.index_path))]
    assert all(p.problem == "" for p in got)
    assert os.listdir(rank0) == [] and sorted(os.listdir(tmp_path)) == ["d0"]  # nothing else created


def test_fs_of_names_the_longest_mount_point_holding_a_path(tmp_path):
    info = tmp_path / "mountinfo"
    info.write_text(
        "22 27 0:21 / /proc rw,relatime - proc proc rw\n"
        "27 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw\n"
        f"40 27 8:2 / {tmp_path}/my\\040disk rw - xfs /dev/sdb1 rw\n")
    (tmp_path / "my disk" / "l3").mkdir(parents=True)
    assert fs_of(str(tmp_path / "my disk" / "l3"), str(info)) == ("xfs", f"{tmp_path}/my disk")
    assert fs_of("/proc/self", str(info)) == ("proc", "/proc")
    assert fs_of(str(tmp_path), str(info)) == ("ext4", "/")
    assert fs_of("/", str(tmp_path / "absent")) == ("", "")
    assert probe_mod.PSEUDO_FS >= {"proc", "sysfs"}
