"""lmscope.envflags: environment variables read as on/off switches."""

from __future__ import annotations

import pytest

from lmscope.envflags import env_flag


@pytest.mark.parametrize("value", ["", "0", "false", " FALSE ", "no", "Off"])
def test_off_values(monkeypatch, value):
    monkeypatch.setenv("LMSCOPE_TEST_FLAG", value)
    assert env_flag("LMSCOPE_TEST_FLAG", default=True) is False


@pytest.mark.parametrize("value", ["1", "true", "yes", "on", "2"])
def test_on_values(monkeypatch, value):
    monkeypatch.setenv("LMSCOPE_TEST_FLAG", value)
    assert env_flag("LMSCOPE_TEST_FLAG") is True


def test_unset_gives_the_default(monkeypatch):
    monkeypatch.delenv("LMSCOPE_TEST_FLAG", raising=False)
    assert env_flag("LMSCOPE_TEST_FLAG") is False
    assert env_flag("LMSCOPE_TEST_FLAG", default=True) is True
