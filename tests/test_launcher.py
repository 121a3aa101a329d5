"""The launcher (``python -m chainer_autoprof`` / ``chainer-autoprof``), run as a user would.

A script or module run under the launcher behaves as under plain ``python``:
same stdout, stderr (with the summary off) and exit status.  Bad settings stop
it with one line and status 2 before the script starts.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from nvtx_tool import build_injection_library, nvtx_env, read_events, tree
from site_venv import SiteVenv, make_site_venv
from support import EXAMPLES, REPO, clean_env, program

from chainer_autoprof import __version__
from chainer_autoprof.cli import SUBCOMMANDS
from chainer_autoprof.common.settings import SETTINGS

LAUNCHER = ["-m", "chainer_autoprof"]

REPORT = program("launcher_report")

ERROR = program("launcher_error")

TRAIN = program("launcher_train")


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def python(args: list[str], cwd: Path, timeout: float = 240,
           **env: str) -> subprocess.CompletedProcess:
    """``python ARGS`` with the checkout on PYTHONPATH and no agent variables but ``env``."""
    return subprocess.run([sys.executable, *args], cwd=cwd, env=clean_env(**env),
                          capture_output=True, text=True, timeout=timeout)


def same(got: subprocess.CompletedProcess, expected: subprocess.CompletedProcess) -> None:
    assert (got.returncode, got.stdout, got.stderr) == (
        expected.returncode, expected.stdout, expected.stderr)


# -- running the target like python ----------------------------------------------------------

@pytest.mark.parametrize("exit_with", ["0", "3"])
def test_script_runs_as_under_python(tmp_path, exit_with):
    write(tmp_path / "proj" / "s.py", REPORT)
    expected = python(["proj/s.py", "a", "--sync", "1"], tmp_path, EXIT_WITH=exit_with)
    assert expected.returncode == int(exit_with), expected.stderr
    got = python([*LAUNCHER, "proj/s.py", "a", "--sync", "1"], tmp_path, EXIT_WITH=exit_with,
                 CHAINER_PROF_SUMMARY="0")
    same(got, expected)
    assert f"path0 {tmp_path / 'proj'}" in got.stdout
    assert "pickled __main__" in got.stdout


def test_module_runs_as_under_python_dash_m(tmp_path):
    write(tmp_path / "pkg" / "__init__.py", "")
    write(tmp_path / "pkg" / "tool.py", REPORT)
    expected = python(["-m", "pkg.tool", "x", "-y"], tmp_path)
    assert expected.returncode == 0, expected.stderr
    for head in (["-m", "pkg.tool"], ["-mpkg.tool"]):
        same(python([*LAUNCHER, "--summary", "0", *head, "x", "-y"], tmp_path), expected)


def test_uncaught_exception_shows_only_the_users_frames(tmp_path):
    write(tmp_path / "err.py", ERROR)
    expected = python(["err.py"], tmp_path)
    assert expected.returncode == 1 and "atexit ran" in expected.stdout
    got = python([*LAUNCHER, "err.py"], tmp_path, CHAINER_PROF_SUMMARY="0")
    same(got, expected)
    assert "chainer_autoprof" not in got.stderr


def test_options_stop_at_the_script(tmp_path):
    write(tmp_path / "s.py", REPORT)
    got = python([*LAUNCHER, "--granularity=link", "s.py", "--granularity", "x", "--help"],
                 tmp_path, CHAINER_PROF_SUMMARY="0")
    assert got.returncode == 0, got.stderr
    assert "argv ['s.py', '--granularity', 'x', '--help']" in got.stdout
    assert "('CHAINER_PROF_GRANULARITY', 'link')" in got.stdout


def test_double_dash_runs_a_script_named_like_a_subcommand(tmp_path):
    write(tmp_path / "report", "import sys; print('script report', sys.argv)\n")
    for head in (["--", "report"], ["./report"]):
        got = python([*LAUNCHER, *head, "q"], tmp_path, CHAINER_PROF_SUMMARY="0")
        assert got.returncode == 0, got.stderr
        assert got.stdout == f"script report [{head[-1]!r}, 'q']\n"


def test_chainer_training_stdout_byte_identical(tmp_path):
    args = [str(EXAMPLES / "train_mnist_synthetic.py"), "--epoch", "1", "--samples", "400",
            "--out", str(tmp_path / "result")]
    expected = python(args, tmp_path)
    assert expected.returncode == 0, expected.stderr
    build_injection_library()
    got = python([*LAUNCHER, *args], tmp_path, **nvtx_env(tmp_path / "nvtx.%p.tsv"))
    assert got.returncode == 0, got.stderr
    assert got.stdout == expected.stdout  # the summary goes to stderr
    assert got.stderr.strip(), "the summary is printed on stderr"
    lines = tree(read_events(tmp_path / "nvtx.*.tsv"), domain="chainer", allow_open=False)
    assert lines.count("iteration") == 4  # 400 samples / batch 100


def test_status_reports_patch_targets(tmp_path):
    write(tmp_path / "t.py", TRAIN)
    got = python([*LAUNCHER, "--status", "t.py"], tmp_path, CHAINER_PROF_SUMMARY="0")
    assert got.returncode == 0, got.stderr
    assert "patch status at start" in got.stderr and "patch status at exit" in got.stderr
    assert "hits=" in got.stderr


def test_enable_0_runs_the_script_without_agent(tmp_path):
    write(tmp_path / "s.py", "import sys; print(sorted(m for m in sys.modules "
                             "if m.startswith(('chainer_autoprof.agent', 'wrapt'))))\n")
    got = python([*LAUNCHER, "--enable", "0", "s.py"], tmp_path)
    assert (got.returncode, got.stdout, got.stderr) == (0, "[]\n", "")


# -- help, version, bad input ---------------------------------------------------------------

def test_help_documents_every_setting():
    got = python([*LAUNCHER, "--help"], REPO)
    assert got.returncode == 0 and got.stderr == ""
    for setting in SETTINGS:
        assert f"{setting.flag} {setting.metavar}" in got.stdout
        assert setting.env in got.stdout
    for option in ("--status", "--version", "-m MODULE", "report", "merge"):
        assert option in got.stdout


def test_version():
    got = python([*LAUNCHER, "--version"], REPO)
    assert (got.returncode, got.stdout) == (0, f"chainer_autoprof {__version__}\n")


BAD = [
    (["--sync-level", "5"], {}, ["--sync-level='5'", "accepted: an integer from 0 to 3"]),
    (["--sync=maybe"], {}, ["--sync='maybe'", "1/0, true/false"]),
    (["--iterations", "20:10"], {}, ["--iterations='20:10'", "START:STOP"]),
    ([], {"CHAINER_PROF_SYNC": "maybe"}, ["CHAINER_PROF_SYNC='maybe'", "1/0, true/false"]),
    (["--sync", "1"], {"CHAINER_PROF_SYNC_LEVEL": "0"},
     ["--sync=1 contradicts CHAINER_PROF_SYNC_LEVEL=0", "accepted:"]),
    ([], {"CHAINER_PROF_GRANULARTY": "link"}, ["did you mean CHAINER_PROF_GRANULARITY?"]),
    (["--granularty", "link"], {}, ["unknown option --granularty", "did you mean --granularity?"]),
    (["-x"], {}, ["unknown option -x"]),
    (["--sync-level"], {}, ["--sync-level='side.py' is not valid"]),  # the value took the script
]


@pytest.mark.parametrize("flags,env,named", BAD, ids=[" ".join(b[0]) or str(b[1]) for b in BAD])
def test_bad_input_exits_2_before_the_script(tmp_path, flags, env, named):
    side_effect = tmp_path / "ran"
    write(tmp_path / "side.py", f"open({str(side_effect)!r}, 'w').close()\n")
    got = python([*LAUNCHER, *flags, "side.py"], tmp_path, **env)
    assert got.returncode == 2
    assert not side_effect.exists(), "the script must not start"
    assert got.stdout == ""
    assert len(got.stderr.splitlines()) == 1, got.stderr
    assert all(text in got.stderr for text in named), got.stderr


@pytest.mark.parametrize("argv,message", [
    ([], "no script given"),
    (["--sync", "1"], "no script given"),
    (["-m"], "-m needs a module name"),
])
def test_missing_target(tmp_path, argv, message):
    got = python([*LAUNCHER, *argv], tmp_path)
    assert got.returncode == 2 and got.stdout == ""
    assert message in got.stderr and len(got.stderr.splitlines()) == 1


@pytest.mark.parametrize("name", ["report", "merge"])
def test_subcommand_dispatch(tmp_path, name):
    got = python([*LAUNCHER, name, "--help"], tmp_path)
    module = SUBCOMMANDS[name][0]
    try:
        __import__(module)
    except ImportError:
        assert got.returncode == 2 and got.stdout == ""
        assert f"no module {module}" in got.stderr
        assert f"./{name} or -- {name}" in got.stderr
    else:
        assert got.returncode == 0, got.stderr
        assert got.stdout.strip()


# -- settings reach the agent and child processes ---------------------------------------------

@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> SiteVenv:
    """An environment with the real ``chainer_autoprof.pth`` processed at start-up."""
    return make_site_venv(tmp_path_factory.mktemp("launchvenv") / "venv")


PARENT = program("launcher_parent")


def test_flags_reach_child_processes(venv, tmp_path):
    write(tmp_path / "parent.py", PARENT)
    write(tmp_path / "child.py", TRAIN)
    build_injection_library()
    env = venv.env(**nvtx_env(tmp_path / "nvtx.%p.tsv"), CHAINER_PROF_SUMMARY="0")
    got = venv.run([*LAUNCHER, "--granularity", "link", "--sync-level", "2", "parent.py"],
                   tmp_path, env=env)
    assert got.returncode == 0, got.stderr
    exported, child_out = got.stdout.splitlines()
    parent_pid, exported = exported.split(" ", 1)
    assert json.loads(exported) == {"CHAINER_PROF_GRANULARITY": "link",
                                    "CHAINER_PROF_SYNC_LEVEL": "2",
                                    "CHAINER_PROF_ENABLE": "1",
                                    "CHAINER_PROF_SUMMARY": "0"}
    assert child_out.endswith(" link")
    child_events = [e for e in read_events(tmp_path / "nvtx.*.tsv") if e.pid != int(parent_pid)]
    lines = tree(child_events, domain="chainer")
    assert lines.count("iteration") == 2
    assert any(line.strip() == "Classifier" for line in lines), "link ranges in the child"


def test_flags_win_over_an_environment_activated_agent(venv, tmp_path):
    write(tmp_path / "t.py", TRAIN)
    build_injection_library()
    env = venv.env(**nvtx_env(tmp_path / "nvtx.%p.tsv"), CHAINER_PROF_SUMMARY="0",
                   CHAINER_PROF_GRANULARITY="phase")
    got = venv.run([*LAUNCHER, "--granularity", "link", "t.py"], tmp_path, env=env)
    assert got.returncode == 0, got.stderr
    lines = tree(read_events(tmp_path / "nvtx.*.tsv"), domain="chainer")
    assert any(line.strip() == "Classifier" for line in lines), lines
    assert lines.count("iteration") == 2, "one agent, not two"


def test_bad_environment_with_pth_installed_is_one_line(venv, tmp_path):
    write(tmp_path / "side.py", "open('ran', 'w').close()\n")
    got = venv.run([*LAUNCHER, "side.py"], tmp_path,
                   env=venv.env(CHAINER_PROF_SYNC_LEVEL="9"))
    assert got.returncode == 2 and not (tmp_path / "ran").exists()
    assert len(got.stderr.splitlines()) == (1 if sys.version_info >= (3, 10) else 2), got.stderr


# -- the console script -----------------------------------------------------------------------

def _console_script() -> str | None:
    beside = Path(sys.executable).parent / "chainer-autoprof"
    if beside.is_file():
        return str(beside)
    return shutil.which("chainer-autoprof")


def test_console_script(tmp_path):
    script = _console_script()
    if script is None:
        pytest.skip("the chainer-autoprof console script is not installed here (.ci/setup "
                    "installs it)")
    write(tmp_path / "t.py", TRAIN)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHAINER_PROF_")}
    expected = subprocess.run([sys.executable, "t.py"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=240)
    got = subprocess.run([script, "--summary", "0", "--granularity", "link", "t.py"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert got.returncode == 0, got.stderr
    assert got.stdout == expected.stdout.replace(" None\n", " link\n")
    assert got.stderr == "", "the installed agent started without complaint"
    version = subprocess.run([script, "--version"], capture_output=True, text=True, env=env)
    assert version.stdout == f"chainer_autoprof {__version__}\n"
