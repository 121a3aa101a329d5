"""Activation from the environment alone: the real ``chainer_autoprof.pth`` at interpreter start-up.

Each test starts a real interpreter whose site-packages holds the ``.pth``
file (a throw-away venv, see ``site_venv.py``; one test uses the installed
one) and looks at what a user sees: NVTX ranges, stdout, stderr, exit status.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from nvtx_tool import build_injection_library, nvtx_env, read_events, tree
from site_venv import PTH, REPO, SiteVenv, make_site_venv
from support import program

TRAIN = program("activation_train")

MODULES = program("activation_modules")


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> SiteVenv:
    return make_site_venv(tmp_path_factory.mktemp("pthvenv") / "venv")


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def run(venv: SiteVenv, tmp: Path, script: str, nvtx: bool = False, **env: str):
    """Run ``script`` (source) in ``venv``; returns (process, NVTX events)."""
    path = write(tmp / "script.py", script)
    extra = dict(env)
    if nvtx:
        build_injection_library()
        extra.update(nvtx_env(tmp / "nvtx.%p.tsv"))
    proc = venv.run([str(path)], cwd=tmp, env=venv.env(**extra))
    return proc, read_events(tmp / "nvtx.*.tsv") if nvtx else []


def iteration_tree(events) -> list[str]:
    return tree(events, domain="chainer")


def test_no_variable_imports_nothing_of_ours(venv, tmp_path):
    proc, _ = run(venv, tmp_path, MODULES, CHAINER_PROFILE="1", CHAINER_PROF="1")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []
    assert proc.stderr == ""


def test_a_variable_activates_the_agent(venv, tmp_path):
    proc, _ = run(venv, tmp_path, program("activation_agent_on_from_a_variable"),
                  CHAINER_PROF_GRANULARITY="link", CHAINER_PROF_SUMMARY="0")
    assert proc.returncode == 0, proc.stderr
    modules, state = proc.stdout.splitlines()
    assert "chainer_autoprof.agent" in json.loads(modules) and "wrapt" in json.loads(modules)
    assert "chainer" not in json.loads(modules), "the agent must not import Chainer itself"
    assert state == "True link"


def test_env_only_profiles_chainer_and_keeps_stdout(venv, tmp_path):
    plain, _ = run(venv, tmp_path / "plain", TRAIN, nvtx=True)
    assert plain.returncode == 0, plain.stderr
    got, events = run(venv, tmp_path / "agent", TRAIN, nvtx=True,
                      CHAINER_PROF_SYNC="1", CHAINER_PROF_SUMMARY="0")
    assert got.returncode == 0, got.stderr
    assert got.stdout == plain.stdout
    lines = iteration_tree(events)
    assert lines.count("iteration") == 3
    assert "  forward" in lines and "  backward" in lines and "  update" in lines


def test_pth_processed_twice_activates_once(venv, tmp_path):
    # Some venvs reach site-packages twice (lib and lib64); here the line is run twice for sure.
    twice = make_site_venv(tmp_path / "twice")
    twice.add_pth("chainer_autoprof_second.pth")
    once_proc, once_events = run(venv, tmp_path / "once", TRAIN, nvtx=True,
                                 CHAINER_PROF_SUMMARY="0")
    proc, events = run(twice, tmp_path / "two", TRAIN, nvtx=True, CHAINER_PROF_SUMMARY="0")
    assert proc.returncode == 0, proc.stderr
    assert iteration_tree(events) == iteration_tree(once_events)
    assert proc.stdout == once_proc.stdout
    # A bad setting is reported once, not once per processed line.
    bad, _ = run(twice, tmp_path / "bad", "print('ran')\n", CHAINER_PROF_SYNC_LEVEL="5")
    assert bad.returncode == 0 and bad.stdout == "ran\n"
    assert len(bad.stderr.splitlines()) == 1, bad.stderr


@pytest.mark.parametrize("env,named", [
    ({"CHAINER_PROF_SYNC_LEVEL": "5"}, ["CHAINER_PROF_SYNC_LEVEL='5'", "0 to 3"]),
    ({"CHAINER_PROF_SYNC": "maybe"}, ["CHAINER_PROF_SYNC='maybe'", "1/0"]),
    ({"CHAINER_PROF_SYNC": "1", "CHAINER_PROF_SYNC_LEVEL": "0"},
     ["CHAINER_PROF_SYNC=1", "CHAINER_PROF_SYNC_LEVEL=0"]),
    ({"CHAINER_PROF_GRANULARTY": "link"}, ["did you mean CHAINER_PROF_GRANULARITY?"]),
])
def test_bad_settings_leave_agent_off_and_program_runs(venv, tmp_path, env, named):
    plain, _ = run(venv, tmp_path / "plain", TRAIN)
    proc, events = run(venv, tmp_path / "bad", TRAIN, nvtx=True, **env)
    assert proc.returncode == 0
    assert proc.stdout == plain.stdout
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert all(text in lines[0] for text in named), lines[0]
    assert "stays off" in lines[0]
    assert iteration_tree(events) == []


def test_enable_0_keeps_the_agent_off(venv, tmp_path):
    proc, _ = run(venv, tmp_path / "m", MODULES, CHAINER_PROF_ENABLE="0", CHAINER_PROF_SYNC="1")
    assert proc.returncode == 0 and proc.stderr == ""
    assert not {"chainer_autoprof.agent", "wrapt"} & set(json.loads(proc.stdout))
    proc, events = run(venv, tmp_path / "t", TRAIN, nvtx=True, CHAINER_PROF_ENABLE="0",
                       CHAINER_PROF_SYNC="1")
    assert proc.returncode == 0 and proc.stderr == ""
    assert iteration_tree(events) == []


def test_exit_status_and_traceback_unchanged(venv, tmp_path):
    script = "import sys\nprint('out')\ndef f():\n    raise KeyError('k')\nf()\n"
    plain, _ = run(venv, tmp_path / "plain", script)
    proc, _ = run(venv, tmp_path / "plain", script, CHAINER_PROF_SUMMARY="0")
    assert (proc.returncode, proc.stdout, proc.stderr) == (plain.returncode, plain.stdout,
                                                           plain.stderr)
    assert plain.returncode == 1


# -- sitecustomize: ours (the example) in front, the user's still runs once -------------------

USER_SITECUSTOMIZE = program("activation_user_sitecustomize")

REPORT_SITE = program("activation_report_site")


@pytest.fixture(scope="module")
def bare_venv(tmp_path_factory) -> SiteVenv:
    """A venv without the ``.pth`` file (as in a checkout on PYTHONPATH)."""
    return make_site_venv(tmp_path_factory.mktemp("barevenv") / "venv", with_pth=False)


@pytest.mark.parametrize("with_variable", [True, False])
def test_sitecustomize_example_chains_to_users_once(bare_venv, tmp_path, with_variable):
    user = write(tmp_path / "user" / "sitecustomize.py", USER_SITECUSTOMIZE).parent
    log = tmp_path / "log.txt"
    pythonpath = os.pathsep.join([str(REPO / "sitecustomize_example"), str(user), str(REPO)])
    env = {"PYTHONPATH": pythonpath, "SITECUSTOMIZE_LOG": str(log), "CHAINER_PROF_SUMMARY": "0"}
    if not with_variable:
        env = {"PYTHONPATH": pythonpath, "SITECUSTOMIZE_LOG": str(log)}
    proc, _ = run(bare_venv, tmp_path, REPORT_SITE, **env)
    assert proc.returncode == 0, proc.stderr
    modules, mark, active = proc.stdout.splitlines()
    assert log.read_text() == "user sitecustomize ran\n"
    assert mark == "user", "import sitecustomize gives the user's module"
    assert active == str(with_variable)
    if not with_variable:  # the last lines of REPORT_SITE import the agent; before them, nothing
        assert "wrapt" not in json.loads(modules)


def test_sitecustomize_example_reports_users_error_like_python(bare_venv, tmp_path):
    user = write(tmp_path / "user" / "sitecustomize.py", "raise ValueError('broken site')\n")
    script = "print('ran')\n"
    plain, _ = run(bare_venv, tmp_path, script, PYTHONPATH=str(user.parent))
    ours, _ = run(bare_venv, tmp_path, script, PYTHONPATH=os.pathsep.join(
        [str(REPO / "sitecustomize_example"), str(user.parent), str(REPO)]))
    assert "broken site" in plain.stderr
    assert (ours.returncode, ours.stdout, ours.stderr) == (plain.returncode, plain.stdout,
                                                           plain.stderr)


def test_pth_and_users_sitecustomize_both_run(venv, tmp_path):
    user = write(tmp_path / "user" / "sitecustomize.py", USER_SITECUSTOMIZE).parent
    log = tmp_path / "log.txt"
    proc, _ = run(venv, tmp_path, REPORT_SITE, PYTHONPATH=str(user), SITECUSTOMIZE_LOG=str(log),
                  CHAINER_PROF_SUMMARY="0")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[1:] == ["user", "True"]
    assert log.read_text() == "user sitecustomize ran\n"


# -- the installed package --------------------------------------------------------------------

def _installed_pth() -> Path | None:
    dirs = [*site.getsitepackages(), site.getusersitepackages()]
    for directory in dirs:
        path = Path(directory) / "chainer_autoprof.pth"
        if path.is_file():
            return path
    return None


def test_installed_pth_activates(tmp_path):
    installed = _installed_pth()
    if installed is None:
        pytest.skip("chainer_autoprof is not installed in this environment (.ci/setup installs "
                    "it); the throw-away venv tests above cover the .pth file")
    assert installed.read_text() == PTH.read_text()
    build_injection_library()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CHAINER_PROF_", "_CHAINER_PROF_", "NVTX_", "PYTHONPATH"))}
    env.update(nvtx_env(tmp_path / "nvtx.%p.tsv"), CHAINER_PROF_SUMMARY="0")
    script = write(tmp_path / "script.py", program("activation_installed_package"))
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    where, active = proc.stdout.splitlines()[-1].rsplit(" ", 1)
    assert active == "True"
    # The installed copy (or the checkout, for an editable install): not PYTHONPATH's.
    assert installed.parent in Path(where).parents or REPO in Path(where).parents
    assert iteration_tree(read_events(tmp_path / "nvtx.*.tsv")).count("iteration") == 3
