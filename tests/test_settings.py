"""The settings table: defaults parse, bad values give one line naming variable, value, accepted."""

from __future__ import annotations

from pathlib import Path

import pytest

from chainer_autoprof.common import settings
from chainer_autoprof.common.settings import SETTINGS, SettingsError, from_environ


def _error(env: dict[str, str]) -> str:
    with pytest.raises(SettingsError) as info:
        from_environ(env)
    message = str(info.value)
    assert "\n" not in message, "a settings error is one line"
    return message


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.env)
def test_default_text_parses_to_the_default(setting):
    text = "" if setting.default is None else setting.default_text
    assert setting.parse(text) == setting.default
    # The value rendered for a child's environment reads back the same.
    assert setting.parse(settings.to_environ_value(setting, setting.default)) == setting.default
    assert getattr(from_environ({setting.env: text}), setting.name) == setting.default


def test_defaults_without_environment():
    cfg = from_environ({})
    assert cfg.as_dict() == {s.name: s.default for s in SETTINGS}
    assert cfg.effective_sync_level == 0
    assert cfg.explicit == frozenset()


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.env)
def test_every_setting_names_what_it_accepts(setting):
    assert setting.env.startswith("CHAINER_PROF_") and setting.flag.startswith("--")
    assert setting.accepted and setting.doc and setting.metavar


BAD_VALUES = {
    "CHAINER_PROF_ENABLE": ("maybe", "1/0, true/false, yes/no or on/off"),
    "CHAINER_PROF_SYNC": ("maybe", "1/0, true/false, yes/no or on/off"),
    "CHAINER_PROF_SYNC_LEVEL": ("5", "an integer from 0 to 3"),
    "CHAINER_PROF_GRANULARITY": ("layer", "one of iteration, phase, link, function"),
    "CHAINER_PROF_LINK_DEPTH": ("-1", "an integer >= 0"),
    "CHAINER_PROF_DOMAIN": ("  ", "a non-empty string"),
    "CHAINER_PROF_LOG": ("verbose", "one of error, warning, info, debug"),
    "CHAINER_PROF_SUMMARY": ("2", "1/0, true/false, yes/no or on/off"),
    "CHAINER_PROF_ITERATIONS": ("20:10", "START:STOP or START:+COUNT"),
    "CHAINER_PROF_EXIT_AFTER_WINDOW": ("x", "1/0"),
    "CHAINER_PROF_WARMUP": ("three", "an integer >= 0"),
    "CHAINER_PROF_RECORD_LIMIT": ("10", "an integer >= 1000"),
    "CHAINER_PROF_ADVICE": ("nope", "1/0"),
    "CHAINER_PROF_REPLAY_BATCH": ("7", "1/0"),
    "CHAINER_PROF_NATIVE": ("c", "1/0"),
    "CHAINER_PROF_CHILDREN": ("all", "1/0"),
    "CHAINER_PROF_RANKS": ("0,x", "'all' or a comma-separated list of ranks"),
    "CHAINER_PROF_STALL": ("soon", "seconds (a number > 0), auto, or 0/off"),
    "CHAINER_PROF_FLUSH_INTERVAL": ("-1", "a number of seconds >= 0"),
    "CHAINER_PROF_GC": ("sometimes", "1/0, true/false, yes/no or on/off"),
    "CHAINER_PROF_GPU_ACTIVITY": ("cupti", "1/0, true/false, yes/no or on/off"),
}


def test_bad_value_table_covers_every_setting():
    assert set(BAD_VALUES) == {s.env for s in SETTINGS if s.env != "CHAINER_PROF_TRACE"}


@pytest.mark.parametrize("env", sorted(BAD_VALUES))
def test_bad_value_is_one_line_naming_variable_value_and_accepted(env):
    value, accepted = BAD_VALUES[env]
    message = _error({env: value})
    assert message.startswith(f"{env}={value!r} is not valid")
    assert f"accepted: {accepted}" in message


def test_sync_level_out_of_range():
    assert _error({"CHAINER_PROF_SYNC_LEVEL": "5"}) == (
        "CHAINER_PROF_SYNC_LEVEL='5' is not valid: accepted: an integer from 0 to 3")


def test_sync_maybe():
    message = _error({"CHAINER_PROF_SYNC": "maybe"})
    assert message == ("CHAINER_PROF_SYNC='maybe' is not valid: "
                       "accepted: 1/0, true/false, yes/no or on/off")


@pytest.mark.parametrize("sync,level", [("1", "0"), ("0", "2")])
def test_sync_contradicting_sync_level(sync, level):
    message = _error({"CHAINER_PROF_SYNC": sync, "CHAINER_PROF_SYNC_LEVEL": level})
    assert f"CHAINER_PROF_SYNC={sync}" in message and f"CHAINER_PROF_SYNC_LEVEL={level}" in message
    assert "contradicts" in message and "accepted:" in message


@pytest.mark.parametrize("env,level", [
    ({"CHAINER_PROF_SYNC": "1"}, 1),
    ({"CHAINER_PROF_SYNC": "yes", "CHAINER_PROF_SYNC_LEVEL": "3"}, 3),
    ({"CHAINER_PROF_SYNC_LEVEL": "2"}, 2),
    ({"CHAINER_PROF_SYNC": "off"}, 0),
    ({"CHAINER_PROF_SYNC_LEVEL": ""}, 0),
])
def test_effective_sync_level(env, level):
    assert from_environ(env).effective_sync_level == level


def test_unknown_variable_did_you_mean():
    message = _error({"CHAINER_PROF_GRANULARTY": "link"})
    assert message.startswith("CHAINER_PROF_GRANULARTY is not a chainer_autoprof setting")
    assert "did you mean CHAINER_PROF_GRANULARITY?" in message


def test_unknown_variable_without_close_match():
    message = _error({"CHAINER_PROF_ZZZZZZ": "1"})
    assert "CHAINER_PROF_ZZZZZZ is not a chainer_autoprof setting" in message
    assert "did you mean" not in message


def test_other_variables_are_ignored():
    cfg = from_environ({"CHAINER_PROFILE": "x", "_CHAINER_PROF_ROOT_PID": "1", "PATH": "/bin"})
    assert cfg.explicit == frozenset()


@pytest.mark.parametrize("text,window", [("10:20", (10, 20)), ("10:+5", (10, 15)),
                                         (" 0:1 ", (0, 1))])
def test_iteration_window_forms(text, window):
    assert from_environ({"CHAINER_PROF_ITERATIONS": text}).iterations == window


def test_values_are_normalised():
    cfg = from_environ({"CHAINER_PROF_GRANULARITY": " LINK ", "CHAINER_PROF_SUMMARY": "Off",
                        "CHAINER_PROF_RANKS": "3,0", "CHAINER_PROF_TRACE": "t.%p.json"})
    assert (cfg.granularity, cfg.summary, cfg.ranks, cfg.trace) == (
        "link", False, frozenset({0, 3}), "t.%p.json")
    assert cfg.explicit == {"granularity", "summary", "ranks", "trace"}


def test_overrides_win_and_are_validated():
    cfg = from_environ({"CHAINER_PROF_GRANULARITY": "link"}, overrides={"granularity": "function"})
    assert cfg.granularity == "function"
    with pytest.raises(SettingsError, match=r"CHAINER_PROF_WARMUP='x' is not valid"):
        from_environ({}, overrides={"warmup": "x"})
    with pytest.raises(SettingsError, match="unknown setting 'sink'"):
        from_environ({}, overrides={"sink": 1})


@pytest.mark.parametrize("settings", [
    {"sync_level": 7}, {"granularity": 3}, {"warmup": -1}, {"iterations": (5, 2)},
    {"iterations": 5}, {"record_limit": True}, {"link_depth": 1.5}, {"ranks": [-1]},
    {"trace": Path("/dev/null")}, {"trace": Path("/no/such/dir/t.json")}])
def test_keyword_settings_of_any_type_are_validated(settings):
    """``install(sync_level=7)`` is refused as ``CHAINER_PROF_SYNC_LEVEL=7`` is."""
    with pytest.raises(SettingsError) as info:
        from_environ({}, overrides=settings)
    assert "\n" not in str(info.value) and "not valid" in str(info.value)


def test_keyword_settings_of_other_types_are_taken_when_valid():
    cfg = from_environ({}, overrides={"sync_level": 2, "iterations": [10, 20], "summary": 0,
                                      "ranks": {3, 0}, "trace": Path("t.json"), "warmup": None})
    assert (cfg.sync_level, cfg.iterations, cfg.summary, cfg.ranks, cfg.trace, cfg.warmup) == (
        2, (10, 20), False, frozenset({0, 3}), "t.json", 3)


def test_markdown_table_has_a_row_per_setting():
    rows = settings.markdown_table().splitlines()[2:]
    assert [row.split("|")[1].strip(" `") for row in rows] == [s.env for s in SETTINGS]
    assert all(row.count("|") == 6 for row in rows), "a cell must not contain '|'"
