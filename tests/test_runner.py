"""chainer_autoprof.runner runs targets exactly like plain ``python`` (real subprocesses)."""

import os
import signal
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
from support import program

REPO = Path(__file__).resolve().parents[1]
LAUNCH = ("import sys; from chainer_autoprof.runner import exec_target; "
          "exec_target(sys.argv[1], sys.argv[2], sys.argv[3:])")

REPORT = program("runner_report")


@pytest.fixture
def launcher_dir(tmp_path: Path) -> Path:
    """A directory with ``autoprof_launch.py``, so the launcher can itself run as ``-m``."""
    d = tmp_path / "launcher"
    d.mkdir()
    (d / "autoprof_launch.py").write_text(LAUNCH + "\n")
    return d


def _run(
    cmd: list[str], cwd: Path, extra_path: Path | None = None
) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in (REPO, extra_path) if p)
    env.pop("PYTHONSAFEPATH", None)
    return subprocess.run(
        cmd, check=False, cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def python(
    args: list[str], cwd: Path, extra_path: Path | None = None
) -> subprocess.CompletedProcess:
    """Plain ``python ARGS``."""
    return _run([sys.executable, *args], cwd, extra_path)


def launched(
    kind: str,
    target: str,
    args: list[str],
    cwd: Path,
    extra_path: Path | None = None,
    via_m: bool = False,
) -> subprocess.CompletedProcess:
    """``exec_target(kind, target, args)`` from ``python -c`` (or ``-m autoprof_launch``)."""
    head = ["-m", "autoprof_launch"] if via_m else ["-c", LAUNCH]
    return _run([sys.executable, *head, kind, target, *args], cwd, extra_path)


def same(a: subprocess.CompletedProcess, b: subprocess.CompletedProcess) -> None:
    assert (a.returncode, a.stdout, a.stderr) == (b.returncode, b.stdout, b.stderr)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


@pytest.mark.parametrize("via_m", [False, True], ids=["launcher-c", "launcher-m"])
@pytest.mark.parametrize("script", ["s.py", "./sub/../s.py", "{abs}/s.py", "link/s.py"])
def test_script_environment_matches_python(tmp_path, launcher_dir, via_m, script):
    write(tmp_path / "proj" / "s.py", REPORT)
    (tmp_path / "proj" / "sub").mkdir()
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "link").symlink_to(tmp_path / "proj")
    cwd = tmp_path / "work" if script.startswith("link") else tmp_path / "proj"
    script = script.format(abs=tmp_path / "proj")
    expected = python([script, "a", "--b"], cwd, launcher_dir)
    assert expected.returncode == 0, expected.stderr
    got = launched("path", script, ["a", "--b"], cwd, launcher_dir, via_m)
    same(got, expected)
    # sys.path is shared via PYTHONPATH, so the whole list is compared, not just sys.path[0].
    assert f"path ['{tmp_path / 'proj'}', '{REPO}'" in got.stdout


def test_pickle_and_multiprocessing(tmp_path, launcher_dir):
    write(
        tmp_path / "mp.py",
        program("runner_pickle_and_multiprocessing"),
    )
    expected = python(["mp.py"], tmp_path)
    assert expected.returncode == 0, expected.stderr
    assert "spawn [0, 1, 4, 9]" in expected.stdout
    same(launched("path", "mp.py", [], tmp_path), expected)
    same(launched("path", "mp.py", [], tmp_path, launcher_dir, via_m=True), expected)


@pytest.mark.parametrize(
    "body",
    [
        "import sys; print('out'); sys.exit(3)",
        "import sys; sys.exit('bye message')",
        "import sys; sys.exit(None)",
        "import atexit; atexit.register(print, 'atexit ran')\nprint('done')",
    ],
)
def test_exit_codes_match_python(tmp_path, body):
    write(tmp_path / "e.py", body + "\n")
    expected = python(["e.py"], tmp_path)
    same(launched("path", "e.py", [], tmp_path), expected)


USER_ERROR = program("runner_user_error")


def test_uncaught_exception_traceback_is_the_users(tmp_path, launcher_dir):
    write(tmp_path / "err.py", USER_ERROR)
    expected = python(["err.py"], tmp_path, launcher_dir)
    assert expected.returncode == 1 and "atexit ran" in expected.stdout
    for via_m in (False, True):
        got = launched("path", "err.py", [], tmp_path, launcher_dir, via_m)
        same(got, expected)
        assert "runner.py" not in got.stderr and "autoprof_launch" not in got.stderr
        assert f'File "{tmp_path / "err.py"}", line 5, in inner' in got.stderr


def test_user_excepthook_gets_trimmed_traceback(tmp_path):
    write(
        tmp_path / "hook.py",
        program("runner_user_excepthook"),
    )
    expected = python(["hook.py"], tmp_path)
    assert expected.stdout.startswith("hook RuntimeError x [(")
    same(launched("path", "hook.py", [], tmp_path), expected)


@pytest.mark.skipif(os.name != "posix", reason="death by SIGINT is POSIX behaviour")
def test_keyboard_interrupt_dies_by_sigint_after_atexit(tmp_path, launcher_dir):
    write(
        tmp_path / "ki.py",
        program("runner_keyboard_interrupt"),
    )
    expected = python(["ki.py"], tmp_path, launcher_dir)
    assert expected.returncode == -signal.SIGINT and "atexit ran" in expected.stdout
    for via_m in (False, True):
        same(launched("path", "ki.py", [], tmp_path, launcher_dir, via_m), expected)


def _make_package(root: Path) -> None:
    write(root / "mypkg" / "__init__.py", "print('init', __name__)\n")
    write(root / "mypkg" / "__main__.py", REPORT)
    write(root / "mypkg" / "mod.py", REPORT + "import mypkg.helper\n")
    write(root / "mypkg" / "helper.py", "print('helper', __name__)\n")
    write(root / "mypkg" / "bad.py", USER_ERROR)


@pytest.mark.parametrize("via_m", [False, True], ids=["launcher-c", "launcher-m"])
@pytest.mark.parametrize("module", ["mypkg", "mypkg.mod", "mypkg.bad"])
def test_module_matches_python_dash_m(tmp_path, launcher_dir, via_m, module):
    _make_package(tmp_path)
    expected = python(["-m", module, "x", "-y"], tmp_path, launcher_dir)
    assert expected.returncode == (1 if module.endswith("bad") else 0), expected.stderr
    got = launched("module", module, ["x", "-y"], tmp_path, launcher_dir, via_m)
    same(got, expected)
    assert "runner.py" not in got.stderr


def test_directory_and_zip_with_main(tmp_path):
    write(tmp_path / "app" / "__main__.py", REPORT)
    with zipfile.ZipFile(tmp_path / "app.pyz", "w") as zf:
        zf.write(tmp_path / "app" / "__main__.py", "__main__.py")
    (tmp_path / "nomain").mkdir()
    for target in ("app", "./app/", "app.pyz", "nomain"):
        expected = python([target, "q"], tmp_path)
        assert expected.returncode == (1 if target == "nomain" else 0), expected.stderr
        same(launched("path", target, ["q"], tmp_path), expected)


def test_pyc_script(tmp_path):
    import py_compile

    write(tmp_path / "c.py", REPORT)
    py_compile.compile(
        str(tmp_path / "c.py"), cfile=str(tmp_path / "c.pyc"), doraise=True
    )
    (tmp_path / "c.py").unlink()
    expected = python(["c.pyc"], tmp_path)
    assert expected.returncode == 0, expected.stderr
    same(launched("path", "c.pyc", [], tmp_path), expected)


def test_missing_script_and_module(tmp_path):
    expected = python(["nosuch.py"], tmp_path)
    assert expected.returncode == 2 and "can't open file" in expected.stderr
    same(launched("path", "nosuch.py", [], tmp_path), expected)

    expected = python(["-m", "nosuch_mod_xyz"], tmp_path)
    assert (
        expected.returncode == 1 and "No module named nosuch_mod_xyz" in expected.stderr
    )
    same(launched("module", "nosuch_mod_xyz", [], tmp_path), expected)


def test_bad_kind_is_rejected(tmp_path):
    got = _run([sys.executable, "-c", LAUNCH, "bogus", "x"], tmp_path)
    assert got.returncode == 1 and "ValueError: kind must be" in got.stderr
