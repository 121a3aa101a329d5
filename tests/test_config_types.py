"""Config's declared attributes (what mypy checks the agent against) follow the settings table."""

from __future__ import annotations

from chainer_autoprof.common.settings import SETTINGS, Config


def test_config_declares_every_setting_and_nothing_else():
    declared = set(Config.__annotations__)
    assert declared == set(Config.__slots__)
    assert declared - {"effective_sync_level", "explicit"} == {s.name for s in SETTINGS}
