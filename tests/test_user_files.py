"""The user's files are never the agent's: links and other users' files at its names, descriptors
the program closed, a nearly full disk.

Real users (created with ``useradd`` when the tests run as root; skipped
otherwise), real symlinks in a sticky world-writable directory as ``/tmp``
is, real descriptors closed by the program and reused for its own files, and
a real small file system (a tmpfs mounted for the test; skipped where
mounting is not allowed).
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest
from support import clean_env, program, write_script

from chainer_autoprof.common import control, outputs
from chainer_autoprof.lifecycle.dump_server import DumpServer

TRAIN = program("user_files_train")

IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


# -- users and directories ------------------------------------------------------------------
def _user(name: str) -> pwd.struct_passwd:
    """A real user of this machine (created with useradd when missing)."""
    if not IS_ROOT:
        pytest.skip("acting as two users needs root (to create them and switch to them)")
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    made = subprocess.run(["useradd", "--system", "--no-create-home", "--shell",
                           "/usr/sbin/nologin", name], capture_output=True, text=True)
    try:  # another test process may have created it meanwhile
        return pwd.getpwnam(name)
    except KeyError:
        pytest.skip(f"cannot create a user with useradd: {made.stderr.strip() or made}")


@pytest.fixture
def victim() -> pwd.struct_passwd:
    """The user who runs the profiled program (not root: permissions apply to them)."""
    return _user("caprof_victim")


@pytest.fixture
def other() -> pwd.struct_passwd:
    """Another user on the same machine."""
    return _user("caprof_other")


@pytest.fixture
def shared() -> Iterator[Path]:
    """A sticky world-writable directory, as /tmp is."""
    path = Path(tempfile.mkdtemp(prefix="caprof-shared-", dir="/tmp"))
    path.chmod(0o1777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def runner(victim: pwd.struct_passwd) -> pwd.struct_passwd | None:
    """Who runs the profiled program: the victim, or root where the interpreter is private
    to root (a Python under /root); root follows links and writes files as the victim would,
    and more."""
    try:
        done = subprocess.run([sys.executable, "-c", "import chainer"], user=victim.pw_uid,
                              group=victim.pw_gid, extra_groups=[], capture_output=True,
                              cwd="/", env=clean_env(HOME="/"), timeout=120)
    except PermissionError:
        return None
    return victim if done.returncode == 0 else None


def _needs(user: pwd.struct_passwd | None) -> pwd.struct_passwd:
    if user is None:
        pytest.skip(f"{sys.executable} cannot be run by another user than root here (its "
                    "directory is private); run the tests with a Python all users can run")
    return user


def _own(path: Path, user: pwd.struct_passwd) -> Path:
    """``path`` (a file or a symlink itself) made ``user``'s."""
    os.lchown(path, user.pw_uid, user.pw_gid)
    return path


def _private_dir(parent: Path, user: pwd.struct_passwd, name: str) -> Path:
    path = parent / name
    path.mkdir()
    os.chown(path, user.pw_uid, user.pw_gid)
    path.chmod(0o700)
    return path


def _agent_as(user: pwd.struct_passwd | None, cwd: Path, args: list[str], **env: str
              ) -> subprocess.Popen:
    """The launcher run as ``user`` (``None``: as root)."""
    who = {} if user is None else {"user": user.pw_uid, "group": user.pw_gid,
                                   "extra_groups": []}
    return subprocess.Popen([sys.executable, "-m", "chainer_autoprof", *args], cwd=cwd,
                            env=clean_env(HOME=str(cwd), **env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **who)  # type: ignore[call-overload]


def _script(where: Path, source: str = TRAIN) -> Path:
    script = write_script(where, "train.py", source)
    script.chmod(0o644)
    return script


# -- 1. links and other users' files at the name of the trace so far -------------------------
def test_a_symlink_planted_at_the_trace_so_far_never_reaches_its_target(shared, victim, other,
                                                                       runner):
    """Another user links ``run.json.partial`` to the victim's file: the file keeps its data,
    the link stays, and one line says why there is no trace so far."""
    home = _private_dir(shared, victim, "home")
    precious = home / "results.csv"
    precious.write_text("epoch,loss\n1,0.5\n")
    _own(precious, victim)
    os.symlink(precious, shared / "run.json.partial")
    _own(shared / "run.json.partial", other)
    proc = _agent_as(runner, shared, ["--summary", "0", "--trace", "run.json",
                                      "--flush-interval", "0.05", str(_script(shared))])
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and out == "trained\n", err
    assert precious.read_text() == "epoch,loss\n1,0.5\n"
    link = shared / "run.json.partial"
    assert link.is_symlink() and os.readlink(link) == str(precious)
    assert err.splitlines() == [
        f"chainer_autoprof: the trace so far is not written: {link} is a symlink (to "
        f"{precious}): the agent writes there only a file it creates itself (the final trace "
        "is still written at exit)"]
    assert json.loads((shared / "run.json").read_text())["traceEvents"]


def test_another_users_file_at_the_trace_so_far_gets_nothing(shared, other, runner):
    """A file another user made there, writable by all, receives nothing of the run (its
    command line, settings, stacks) and stays theirs."""
    planted = shared / "run.json.partial"
    planted.touch()
    _own(planted, other).chmod(0o666)
    proc = _agent_as(runner, shared, ["--summary", "0", "--trace", "run.json",
                                      "--flush-interval", "0.05", str(_script(shared))])
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert planted.stat().st_size == 0 and planted.stat().st_uid == other.pw_uid
    lines = err.splitlines()
    assert len(lines) == 1 and f"belongs to another user (uid {other.pw_uid})" in lines[0], err


def test_a_symlink_to_a_file_the_user_may_not_write_is_not_replaced(shared, other, runner):
    """A link planted while the program runs (in a directory writable by all, not sticky) to
    a file the victim has no right to write: the kernel refuses to open it for them, so the
    final trace does not replace it (resolving the link by name, then renaming over the file,
    would have: the directory lets them)."""
    victim = _needs(runner)
    open_dir = shared / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    theirs = open_dir / "theirs.json"
    theirs.write_text("their data")
    _own(theirs, other).chmod(0o644)
    source = TRAIN + "while not os.path.exists('go'):\n    time.sleep(0.02)\n"
    proc = _agent_as(victim, open_dir, ["--summary", "0", "--trace", "run.json",
                                        "--flush-interval", "0", str(_script(shared, source))])
    try:
        assert proc.stdout.readline() == "trained\n"
        os.symlink(theirs, open_dir / "run.json")
        _own(open_dir / "run.json", other)
        (open_dir / "go").touch()
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert theirs.read_text() == "their data" and theirs.stat().st_uid == other.pw_uid
    assert err.splitlines() == [
        f"chainer_autoprof: could not write the trace {open_dir}/run.json: PermissionError: "
        f"[Errno 13] {open_dir}/run.json is a symlink (to {theirs}) that the kernel does not "
        "let this process write through (the target's permissions, or fs.protected_symlinks)"]
    assert sorted(p.name for p in open_dir.iterdir()) == ["go", "run.json", "theirs.json"]


def test_a_planted_link_in_a_sticky_directory_is_refused_as_the_kernel_would(shared, victim,
                                                                           other, runner):
    """Another user's link at the trace path in a sticky world-writable directory is not
    followed (the rule of ``fs.protected_symlinks``, kept where the kernel's is off): refused
    before the script runs, and the victim's file stays; their own link there is followed."""
    home = _private_dir(shared, victim, "home")
    notes = home / "notes.txt"
    notes.write_text("mine")
    _own(notes, victim)
    os.symlink(notes, shared / "run.json")
    _own(shared / "run.json", other)
    proc = _agent_as(runner, shared, ["--trace", "run.json", str(_script(shared))])
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and out == "", err
    assert err.splitlines() == [
        f"python -m chainer_autoprof: error: --trace='run.json' is not valid: accepted: a file "
        f"path in a writable directory (run.json is a symlink of another user's (uid "
        f"{other.pw_uid}) in a sticky world-writable directory: not followed (the rule of "
        "fs.protected_symlinks))"]
    assert notes.read_text() == "mine"
    _own(shared / "run.json", victim if runner is not None else pwd.getpwuid(0))
    proc = _agent_as(runner, shared, ["--summary", "0", "--trace", "run.json",
                                      str(_script(shared))])
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and err == "", err
    assert json.loads(notes.read_text())["traceEvents"]  # written through the user's own link
    assert (shared / "run.json").is_symlink()


def test_the_trace_so_far_is_private_and_replaces_only_an_earlier_one_of_the_user(tmp_path):
    """Created 0600 whatever the umask; an earlier run's file of the same user is replaced."""
    (tmp_path / "run.json.partial").write_bytes(b"an earlier run's trace so far")
    source = TRAIN + "import stat\nprint(oct(stat.S_IMODE(os.stat('run.json.partial').st_mode)))\n"
    script = write_script(tmp_path, "train.py", source)
    run = subprocess.run([sys.executable, "-m", "chainer_autoprof", "--summary", "0",
                          "--trace", "run.json", "--flush-interval", "0.05", str(script)],
                         env=clean_env(), cwd=tmp_path, capture_output=True, text=True,
                         timeout=120, preexec_fn=lambda: os.umask(0))
    assert run.returncode == 0 and run.stderr == "", run.stderr
    assert run.stdout == "trained\n0o600\n"
    assert not (tmp_path / "run.json.partial").exists()  # deleted after the final trace


# -- 2. descriptors the program closed and reused ---------------------------------------------
DAEMONIZING = program("user_files_daemonizing")


def test_descriptors_the_program_closed_and_reused_never_get_the_agents_writes(tmp_path):
    """After ``os.closerange(3, 256)`` the program's own files take the numbers the agent had:
    they get only the program's lines, ``dump`` still reaches the process (twice), the trace so
    far and the final trace are still written, and the exit says nothing."""
    script = write_script(tmp_path, "train.py", DAEMONIZING)
    proc = subprocess.Popen([sys.executable, "-m", "chainer_autoprof", "--summary", "0",
                             "--trace", "run.json", "--flush-interval", "0.05", str(script)],
                            env=clean_env(), cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "closed\n"
        time.sleep(0.3)  # background writes after the close
        partial = tmp_path / "run.json.partial"
        written = partial.stat().st_mtime_ns
        for _ in range(2):
            dump = subprocess.run([sys.executable, "-m", "chainer_autoprof", "dump",
                                   "--no-print", str(proc.pid)], env=clean_env(), cwd=tmp_path,
                                  capture_output=True, text=True, timeout=60)
            assert dump.returncode == 0 and "report on request" in dump.stdout, dump.stderr
        deadline = time.monotonic() + 10
        while partial.stat().st_mtime_ns == written and time.monotonic() < deadline:
            time.sleep(0.05)
        assert partial.stat().st_mtime_ns > written  # still written, to its own file
        (tmp_path / "go").touch()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and err == "", err
    lines = int(out.strip())
    for i in range(6):
        expected = "".join(f"{n},{n * 2}\n" for n in range(lines))
        assert (tmp_path / f"user{i}.csv").read_text() == expected
    assert json.loads((tmp_path / "run.json").read_text())["traceEvents"]
    assert not partial.exists()


def test_the_dump_server_never_closes_a_number_the_program_reused(tmp_path):
    """The program closed the listening socket and its number is a file of its own now: the
    server stops without closing it, and listens anew meanwhile."""
    def handle(message: dict) -> dict:
        raise RuntimeError("answered with an error")

    server = DumpServer(handle)
    assert server.start()
    number = server._sock.fileno()
    user_file = os.open(tmp_path / "mine.log", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.dup2(user_file, number)  # closerange + open: the same number, the program's file
        deadline = time.monotonic() + 5
        while True:  # a request wakes a blocked accept(); the server may be listening anew
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
                    client.settimeout(5)
                    client.connect(server.address)
                    client.sendall(b"{}\n")
                    assert b"answered with an error" in client.recv(1000)
                break
            except ConnectionRefusedError:
                assert time.monotonic() < deadline, "nothing listens any more"
                time.sleep(0.01)
        while server._sock is None or server._sock.fileno() in (-1, number):
            assert time.monotonic() < deadline, "the server did not listen anew"
            time.sleep(0.01)
        server.stop()
        os.write(number, b"still mine\n")  # open, and the program's
        assert os.path.samestat(os.fstat(number), os.fstat(user_file))
    finally:
        with contextlib.suppress(OSError):
            os.close(number)
        os.close(user_file)
    assert (tmp_path / "mine.log").read_text() == "still mine\n"


def test_a_stop_while_the_server_listens_anew_leaves_nothing_listening(tmp_path, monkeypatch):
    """The program closed the socket and the server is making its new one when the agent stops
    (the program exits): stop() returns, and the new socket is closed and its file removed, not
    left listening with a thread serving it."""
    made: list[control.Listening] = []
    relistening, go_on = threading.Event(), threading.Event()
    listen = control.listen

    def slow_second_listen(backlog: int = 8) -> control.Listening:
        listening = listen(backlog)
        made.append(listening)
        if len(made) == 2:  # the server listening anew: hold it there until stop() has run
            relistening.set()
            go_on.wait(10)
        return listening

    monkeypatch.setattr(control, "listen", slow_second_listen)
    server = DumpServer(lambda message: ({"ok": True}, None))
    assert server.start()
    serving = server._thread
    number = made[0].sock.fileno()
    user_file = os.open(tmp_path / "mine.log", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.dup2(user_file, number)  # the program's file at the socket's number
        deadline = time.monotonic() + 5
        while not relistening.is_set():  # a request wakes the blocked accept()
            assert time.monotonic() < deadline, "the server did not listen anew"
            with contextlib.suppress(OSError), \
                    socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
                client.settimeout(5)
                client.connect(made[0].path)
                client.sendall(b"{}\n")
                client.recv(1000)
            relistening.wait(0.05)
        server.stop()
        go_on.set()
        assert serving is not None
        serving.join(5)
        assert not serving.is_alive()
        assert not [t for t in threading.enumerate() if t.name == "chainer_autoprof dump server"]
        assert made[1].sock.fileno() == -1, "the new socket was left open"
        assert not os.path.exists(made[1].path), "the new socket's file was left behind"
        assert os.path.samestat(os.fstat(number), os.fstat(user_file))  # the program's, open
    finally:
        go_on.set()
        with contextlib.suppress(OSError):
            os.close(number)
        os.close(user_file)


def test_a_whole_file_write_stops_when_its_descriptor_is_the_programs(tmp_path):
    """The program takes the number of the writer's temporary file mid-write: nothing more goes
    to that number, it stays open, the old output and no temporary remain."""
    target = tmp_path / "out.json"
    target.write_text("the old one")
    mine = os.open(tmp_path / "program.log", os.O_WRONLY | os.O_CREAT, 0o644)
    taken = None
    try:
        with pytest.raises(OSError, match="closed by the program"), \
                outputs.atomic_text(str(target)) as out:
            out.write("x" * 10)
            taken = out.fileno()
            os.dup2(mine, taken)
            out.write("y" * (4 << 20))
        os.write(taken, b"program\n")  # still open
    finally:
        for fd in {taken, mine} - {None}:
            with contextlib.suppress(OSError):
                os.close(fd)  # type: ignore[arg-type]
    assert (tmp_path / "program.log").read_text() == "program\n"
    assert target.read_text() == "the old one"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json", "program.log"]


# -- 3. a nearly full disk -------------------------------------------------------------------
@pytest.fixture
def small_disk() -> Iterator[Path]:
    """A real 24 MiB file system (tmpfs) of the test's own."""
    path = Path(tempfile.mkdtemp(prefix="caprof-disk-"))
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m,mode=0755", "tmpfs",
                              str(path)], capture_output=True, text=True)
    if mounted.returncode != 0:
        path.rmdir()
        pytest.skip(f"cannot mount a small file system here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)
        path.rmdir()


def _fill(disk: Path, leave: int) -> None:
    """Fill ``disk`` with a file of its own until ``leave`` bytes are free."""
    st = os.statvfs(disk)
    with open(disk / "filler", "wb") as f:
        f.write(b"\0" * (st.f_bavail * st.f_frsize - leave))


def _ours(disk: Path) -> list[str]:
    return sorted(p.name for p in disk.iterdir()
                  if p.name.startswith(outputs.TEMP_PREFIX) or p.name.endswith(".partial"))


#: Many ranges quickly (its own annotations), then a checkpoint of 3 MB.
BUSY = program("user_files_busy")


def test_the_trace_so_far_leaves_the_disk_to_the_program(small_disk):
    """On a nearly full disk the trace so far stops before the program would run out, and what
    it wrote goes: the program's checkpoint is saved whole."""
    _fill(small_disk, 7 << 20)
    script = write_script(small_disk, "train.py", BUSY)
    run = subprocess.run([sys.executable, "-m", "chainer_autoprof", "--summary", "0",
                          "--trace", "run.json", "--flush-interval", "0.05",
                          "--record-limit", "400000", str(script)], env=clean_env(),
                         cwd=small_disk, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout == "saved\n", run.stderr
    with __import__("numpy").load(small_disk / "checkpoint.npz") as saved:
        assert saved["W"].shape == (1000, 750)
    lines = run.stderr.splitlines()
    assert lines[0].startswith("chainer_autoprof: the trace so far stops: the disk is nearly "
                               "full: "), lines
    assert "more would leave less than the 3.6 MB kept for the program (15% of it, at most " \
        "4.0 GB)" in lines[0]
    assert f"{small_disk}/run.json.partial deleted" in lines[0]
    # the final trace, at exit, finds no room either: one line, and nothing of it left
    assert lines[1:] in ([], [f"chainer_autoprof: could not write the trace {small_disk}/"
                              "run.json: OSError: [Errno 28] No space left on device"]), lines
    assert _ours(small_disk) == []


#: Some training, then the program fills the disk itself and ends.
FILLS_THE_DISK = program("user_files_fills_the_disk")


def test_a_run_that_filled_the_disk_leaves_no_trace_so_far_behind(small_disk):
    """The program filled the disk: the final trace cannot be written, and the trace so far
    does not keep the disk full."""
    script = write_script(small_disk, "train.py", FILLS_THE_DISK)
    run = subprocess.run([sys.executable, "-m", "chainer_autoprof", "--summary", "0",
                          "--trace", "run.json", "--flush-interval", "0.05", str(script)],
                         env=clean_env(), cwd=small_disk, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0 and run.stdout == "full\n", run.stderr
    assert _ours(small_disk) == [] and not (small_disk / "run.json").exists()
    lines = run.stderr.splitlines()
    assert len(lines) == 2, lines
    assert any("run.json.partial deleted" in line for line in lines), lines
    assert any(line.startswith("chainer_autoprof: could not write the trace") for line in lines)


def test_the_headroom_rule(small_disk):
    """15 % of the file system, at most 4 GiB; checked before each write, on the file's own
    file system."""
    assert outputs.headroom(100 << 20) == 15 << 20
    assert outputs.headroom(100 << 40) == 4 << 30
    _fill(small_disk, 5 << 20)
    made = outputs.PrivateFile.create(str(small_disk / "x.partial"), b"a" * (1 << 20))
    with pytest.raises(outputs.NoRoomError):
        made.append(b"b" * (1 << 20))  # would leave 3 MiB of 24 MiB: under 3.6 MB
    assert (small_disk / "x.partial").read_bytes() == b"a" * (1 << 20)
    assert stat.S_IMODE((small_disk / "x.partial").stat().st_mode) == 0o600
    assert made.remove() and _ours(small_disk) == []


def test_a_frame_between_lines_does_not_stop_the_background_writes():
    """Another thread's frame may have no line number at the moment it is read (CPython 3.11):
    the snapshot of the trace so far shows it without one instead of failing."""
    from types import SimpleNamespace

    from chainer_autoprof.lifecycle import where

    code = SimpleNamespace(co_filename="/srv/train.py", co_name="step")
    frames = where._frames(SimpleNamespace(f_code=code, f_lineno=None, f_back=None))
    assert frames == [{"file": "/srv/train.py", "line": None, "func": "step", "code": ""}]


def test_another_users_file_at_the_trace_path_is_refused_before_the_script_runs(shared, other,
                                                                              runner):
    """In a sticky directory the kernel would refuse to replace it at the end of the run (the
    trace lost after all the work): said before the script runs; the file stays theirs."""
    victim = _needs(runner)
    planted = shared / "run.json"
    planted.write_text("their data")
    _own(planted, other).chmod(0o666)
    proc = _agent_as(victim, shared, ["--trace", "run.json", str(_script(shared))])
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and out == "", err
    assert err.splitlines() == [
        "python -m chainer_autoprof: error: --trace='run.json' is not valid: accepted: a file "
        f"path in a writable directory (run.json belongs to another user (uid {other.pw_uid}) "
        "in a sticky directory: it cannot be replaced)"]
    assert planted.read_text() == "their data" and planted.stat().st_uid == other.pw_uid
