"""Which Apache RocketMQ releases the real-broker tests run on: the full suite on NEWEST unless
ROCKETMQ_SPARK_REAL_VERSION names another 5.x release, the parity subset on the others."""

from __future__ import annotations

from pathlib import Path

import pytest

from real_rocketmq import NEWEST, VERSION_4, VERSION_ENV, RealRocketMQ, parity_releases, release_from_env


def test_the_full_suite_runs_on_the_newest_release_unless_told_otherwise() -> None:
    assert NEWEST == "5.5.0"
    assert release_from_env({}) == NEWEST
    assert release_from_env({VERSION_ENV: ""}) == NEWEST  # set but empty: as if unset
    assert release_from_env({VERSION_ENV: " 5.3.3 "}) == "5.3.3"
    assert release_from_env({VERSION_ENV: "5.4.0"}) == "5.4.0"


@pytest.mark.parametrize("value", ["4.9.7", "5.5", "v5.5.0", "latest", "5.5.0-SNAPSHOT", "5.x"])
def test_a_release_the_suite_cannot_run_on_is_refused_naming_the_variable_and_what_it_takes(value: str) -> None:
    with pytest.raises(ValueError) as err:
        release_from_env({VERSION_ENV: value})
    message = str(err.value)
    assert VERSION_ENV in message and repr(value) in message
    assert "5.x release as MAJOR.MINOR.PATCH" in message and NEWEST in message


def test_the_parity_releases_are_the_older_ones_without_the_full_suites() -> None:
    assert parity_releases(NEWEST) == ("5.3.3", VERSION_4)
    assert parity_releases("5.3.3") == (VERSION_4,)  # not twice
    assert parity_releases("5.4.0") == ("5.3.3", VERSION_4)


def test_the_variable_never_reaches_the_jvms(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(VERSION_ENV, "5.3.3")
    monkeypatch.setenv("PATH_FOR_THE_TEST", "kept")
    env = RealRocketMQ(lib=Path("/nonexistent"), workdir=Path("/w"))._env()
    assert VERSION_ENV not in env and env["PATH_FOR_THE_TEST"] == "kept"
    assert env["ROCKETMQ_HOME"] == "/w"
