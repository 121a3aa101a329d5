"""The control socket between users: no one can take a process's socket first, and ``dump``
asks only your own processes, saying precisely why when it cannot reach one.

A process's socket lies in its login session's private directory
(``$XDG_RUNTIME_DIR``) where there is one, and ``dump`` finds it from a shell
without that variable.  Real users: as root, the tests create two users for
the duration of the module (``useradd``) and run their part as those users --
a Python child that imports what it needs and then drops its privileges
(``setgid``/``setuid``): a squatter that takes the names first (the socket
name of the old design in Linux's abstract namespace, the directory of the
new one in a shared sticky directory such as /tmp, with a socket that
answers falsely inside), and another user with an agent process of their
own.  Without root, or without ``useradd``, those are skipped with the reason.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from support import REPO, clean_env, program, write_script

from chainer_autoprof.common import control

IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
USERADD = shutil.which("useradd")
USERDEL = shutil.which("userdel")


def _why_not() -> str | None:
    if not sys.platform.startswith("linux"):
        return "needs Linux (users, /proc)"
    if not IS_ROOT:
        return "needs root to create a second user for the test (run the suite as root)"
    if USERADD is None or USERDEL is None:
        return "needs useradd/userdel to create a second user for the test"
    return None


@pytest.fixture(scope="module")
def users():
    """Two users made for these tests (names unique to the run), removed afterwards."""
    if _why_not() is not None:
        pytest.skip(_why_not() or "")
    made = []
    try:
        for role in ("a", "b"):
            name = f"caprof-{role}{secrets.token_hex(3)}"
            subprocess.run([USERADD, "--system", "--no-create-home", "--shell",
                            "/usr/sbin/nologin", name], check=True, capture_output=True)
            made.append(name)
        yield [pwd.getpwnam(name) for name in made]
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"could not create a second user: {exc.stderr!r}")
    finally:
        for name in made:
            uid = pwd.getpwnam(name).pw_uid
            subprocess.run([USERDEL, name], capture_output=True)
            shutil.rmtree(f"/tmp/chainer_autoprof-{uid}", ignore_errors=True)  # its agent's


@pytest.fixture
def shared():
    """A shared sticky directory, as /tmp is (the real /tmp is not touched)."""
    path = Path(tempfile.mkdtemp(prefix="caprof-shared-", dir="/tmp"))
    path.chmod(0o1777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


#: Runs a part of a test as another user: everything it needs is imported first (the
#: interpreter's own files may not be readable to that user), then the privileges go.
AS_USER = program("control_socket_as_user")


def as_user(user: pwd.struct_passwd, code: str, *args: str, **popen) -> subprocess.Popen:
    source = AS_USER.format(repo=str(REPO), gid=user.pw_gid, uid=user.pw_uid,
                            code=textwrap.dedent(code))
    return subprocess.Popen([sys.executable, "-c", source, *args], env=clean_env(),
                            cwd="/", text=True, **popen)


def run_as_user(user: pwd.struct_passwd, code: str, *args: str) -> subprocess.CompletedProcess:
    proc = as_user(user, code, *args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


#: The squatter: takes the names a victim's agent would use before it starts, and answers
#: anyone who connects with a made-up report.
SQUAT = program("control_socket_squat")

#: The victim: a program with the agent, started only once the squatter is ready (its pid is
#: known before the agent starts: it execs the launcher when told to).
WAIT_THEN_LAUNCH = ("import os, sys; sys.stdin.readline(); os.execv(sys.executable, "
                    "[sys.executable, '-m', 'chainer_autoprof', '--summary', '0', sys.argv[1]])")
IDLE = program("control_socket_idle")


def test_names_taken_first_by_another_user_do_not_keep_dump_from_your_process(users, shared,
                                                                              tmp_path):
    attacker = users[0]
    script = write_script(tmp_path, "idle.py", IDLE)
    env = clean_env(TMPDIR=str(shared))
    env.pop("XDG_RUNTIME_DIR", None)
    victim = subprocess.Popen([sys.executable, "-c", WAIT_THEN_LAUNCH, str(script)], env=env,
                              cwd=tmp_path, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    squatter = as_user(attacker, SQUAT, str(victim.pid), str(shared), str(os.geteuid()),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert squatter.stdout.readline() == "squatting\n", squatter.stderr.read()
        victim.stdin.write("go\n")
        victim.stdin.flush()
        assert victim.stdout.readline() == "running\n", victim.stderr.read()
        # the user asks from another shell (no TMPDIR there): the process answers, itself
        dump = subprocess.run([sys.executable, "-m", "chainer_autoprof", "dump", "--no-print",
                               str(victim.pid)], env=clean_env(), capture_output=True,
                              text=True, timeout=60)
        assert dump.returncode == 0, dump.stderr
        assert dump.stdout.startswith(f"chainer_autoprof: report on request: pid {victim.pid}")
        assert "FAKE" not in dump.stdout
        victim.stdin.write("end\n")
        victim.stdin.flush()
        _out, err = victim.communicate(timeout=60)
    finally:
        squatter.kill()
        squatter.wait()
        if victim.poll() is None:
            victim.kill()
            victim.wait()
    assert victim.returncode == 0, err
    # the victim said, in one line, what it found and where it listens instead
    taken = shared / f"chainer_autoprof-{os.geteuid()}"
    assert err.splitlines() == [
        line for line in err.splitlines() if line.startswith("chainer_autoprof: control socket: ")]
    assert len(err.splitlines()) == 1, err
    assert f"{taken} belongs to {attacker.pw_name} (uid {attacker.pw_uid}), not to " in err
    assert f"listening in /tmp/chainer_autoprof-{os.geteuid()} instead (remove {taken}" in err
    assert sorted(p.name for p in shared.iterdir()) == [taken.name]  # left to its owner


def test_where_every_usual_directory_is_taken_a_private_one_serves(users, shared, monkeypatch):
    """The squatter holds the directory in $TMPDIR and in the system's temporary directory:
    the agent listens in a private directory of a random name beside it, which ``dump``
    finds (the list of bound sockets), and removes it at the end."""
    from chainer_autoprof.common import control

    attacker = users[0]
    system_tmp = shared / "system"
    system_tmp.mkdir(mode=0o1777)
    system_tmp.chmod(0o1777)
    monkeypatch.setattr(control, "SYSTEM_TMP", str(system_tmp))
    monkeypatch.setenv("TMPDIR", str(shared))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    made = run_as_user(attacker, """
        for base in sys.argv[1:]:
            os.mkdir(os.path.join(base, f"chainer_autoprof-0"), 0o700)
        """, str(shared), str(system_tmp))
    assert made.returncode == 0, made.stderr
    listening = control.listen()
    try:
        assert listening.own_dir is not None
        assert os.path.dirname(listening.own_dir) == str(shared)
        assert os.path.basename(listening.own_dir).startswith("chainer_autoprof-0-")
        assert control.check_private(listening.own_dir, 0) is None
        assert len(listening.notes) == 1
        assert f"{shared}/chainer_autoprof-0 belongs to {attacker.pw_name}" in listening.notes[0]
        assert f"{system_tmp}/chainer_autoprof-0 belongs to" in listening.notes[0]
        assert control.locate(os.getpid()) == listening.path
    finally:
        listening.sock.close()
        control.unlisten(listening)
    assert not os.path.exists(listening.own_dir)


#: Another user's program with the agent: installed from Python, it waits for a line.
OTHER_USERS_AGENT = program("control_socket_other_users_agent")

DUMP = """
sys.exit(chainer_autoprof.cli.main(["dump", "--no-print", *sys.argv[1:]]))
"""


def test_dump_asks_only_your_own_processes_and_says_why_not_another_users(users, tmp_path):
    mine = users[1]
    # a process of root's (this test's user) with the agent ...
    script = write_script(tmp_path, "idle.py", IDLE)
    roots = subprocess.Popen([sys.executable, "-m", "chainer_autoprof", "--summary", "0",
                              str(script)], env=clean_env(), cwd=tmp_path,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    # ... and one of the other user's
    theirs = as_user(mine, OTHER_USERS_AGENT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE)
    try:
        assert roots.stdout.readline() == "running\n", roots.stderr.read()
        line = theirs.stdout.readline()
        assert line.startswith("running "), theirs.stderr.read()
        their_pid = int(line.split()[1])
        # dump without PIDs, as that user: their own process only
        alone = run_as_user(mine, DUMP)
        assert alone.returncode == 0, alone.stderr
        assert alone.stderr == ""
        asked = [int(line.split(" pid ")[1].split()[0]) for line in alone.stdout.splitlines()
                 if line.startswith("chainer_autoprof: report on request: pid ")]
        assert asked == [their_pid], alone.stdout
        # root's process, named: refused, and said why
        named = run_as_user(mine, DUMP, str(roots.pid))
        assert named.returncode == 1
        assert named.stderr.strip() == (
            f"chainer-autoprof dump: pid {roots.pid}: it runs as root (uid 0), not as you "
            f"({mine.pw_name} (uid {mine.pw_uid})): only its own user and root can ask it")
        # root may ask theirs
        by_root = subprocess.run([sys.executable, "-m", "chainer_autoprof", "dump",
                                  "--no-print", str(their_pid)], env=clean_env(),
                                 capture_output=True, text=True, timeout=60)
        assert by_root.returncode == 0, by_root.stderr
        assert f"report on request: pid {their_pid}" in by_root.stdout
    finally:
        for proc in (roots, theirs):
            try:
                proc.stdin.write("end\n")
                proc.stdin.flush()
                proc.communicate(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait()
    assert roots.returncode == 0 and theirs.returncode == 0


def test_the_socket_lies_in_the_sessions_private_directory_and_dump_finds_it(tmp_path):
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    script = write_script(tmp_path, "idle.py", IDLE)
    proc = subprocess.Popen([sys.executable, "-m", "chainer_autoprof", "--summary", "0",
                             str(script)], env=clean_env(XDG_RUNTIME_DIR=str(runtime)),
                            cwd=tmp_path, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "running\n", proc.stderr.read()
        directory = runtime / "chainer_autoprof"
        assert [p.name for p in directory.iterdir()] == [f"{proc.pid}.sock"]
        assert directory.stat().st_mode & 0o777 == 0o700
        shell = clean_env()
        shell.pop("XDG_RUNTIME_DIR", None)
        dump = subprocess.run([sys.executable, "-m", "chainer_autoprof", "dump", "--no-print",
                               str(proc.pid)], env=shell, capture_output=True, text=True,
                              timeout=60)
        assert dump.returncode == 0, dump.stderr
        assert dump.stdout.startswith(f"chainer_autoprof: report on request: pid {proc.pid}")
        proc.stdin.write("end\n")
        proc.stdin.flush()
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0 and err == "", err
    assert list(directory.iterdir()) == []  # the socket went with the process


def _process_without_a_leftover_socket() -> subprocess.Popen:
    """A sleeping process without the agent whose pid has no socket file left over."""
    for _ in range(20):
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                env=clean_env())
        left = [os.path.join(d, f"{proc.pid}{control.SUFFIX}")
                for d in control.candidate_dirs(os.geteuid(), clean_env())]
        if not any(os.path.lexists(path) for path in left):
            return proc
        proc.kill()
        proc.wait()
    raise AssertionError("every pid tried had a control socket left over")


def test_dump_of_a_process_that_is_gone_or_never_had_the_agent_says_which(tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    pid = int(gone.stdout)
    result = subprocess.run([sys.executable, "-m", "chainer_autoprof", "dump", str(pid)],
                            env=clean_env(), capture_output=True, text=True, timeout=60)
    if result.returncode == 1 and "no such process" in result.stderr:
        assert result.stderr.strip() == f"chainer-autoprof dump: pid {pid}: no such process"
    # one that never ran the agent (and whose pid no earlier agent left a socket for: a
    # process killed in another test may have had it, and then dump rightly says that)
    sleeper = _process_without_a_leftover_socket()
    try:
        result = subprocess.run([sys.executable, "-m", "chainer_autoprof", "dump",
                                 str(sleeper.pid)], env=clean_env(), capture_output=True,
                                text=True, timeout=60)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert result.returncode == 1
    assert result.stderr.startswith(f"chainer-autoprof dump: pid {sleeper.pid}: no agent "
                                    "listens there (no control socket in ")


@pytest.mark.skipif(not control.LINUX, reason="what is bound is read from /proc/net/unix")
def test_a_sweep_removes_only_the_sockets_no_process_has_bound(tmp_path):
    """The run's first process, at its end, removes the control sockets left by agents that
    died by a signal (a pool's workers): a socket still bound (a live agent's), a file that
    is not a socket, and a name that is not a pid's stay."""
    directory = tmp_path / f"{control.DIR_NAME}-sweep"
    directory.mkdir(mode=0o700)
    live = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    live.bind(str(directory / f"101{control.SUFFIX}"))
    live.listen(1)
    for name in (f"102{control.SUFFIX}", f"103{control.SUFFIX}", f"x{control.SUFFIX}"):
        gone = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        gone.bind(str(directory / name))  # closed below without its file removed: left over
        gone.close()
    (directory / f"104{control.SUFFIX}").write_text("not a socket")
    try:
        assert control.sweep_left(str(directory)) == 2
        assert sorted(p.name for p in directory.iterdir()) == [
            f"101{control.SUFFIX}", f"104{control.SUFFIX}", f"x{control.SUFFIX}"]
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(str(directory / f"101{control.SUFFIX}"))  # the live one still answers
    finally:
        live.close()
