"""Bearer tokens: from a file and the environment, compared in constant time, refusals that
never echo what was sent, and no authentication when none are configured. A configured file
that goes bad while serving (emptied, cut short, deleted, unreadable) never turns it off."""

import os

import pytest

from specdec.serving.api_auth import (TOKENS_ENV, ApiTokens, AuthenticationError, TokenSource, check_security_files,
                                      read_tokens)
from specdec.config.config import SecurityConfig


def test_without_tokens_every_call_is_allowed():
    tokens = ApiTokens.load("", environ={})
    assert not tokens.enabled
    tokens.check(None)
    tokens.check("Bearer anything")


def test_tokens_come_from_the_file_and_the_environment(tmp_path):
    path = tmp_path / "tokens"
    path.write_text("# team A\nalpha-token\n\n  beta-token  # rotated 2026-11\n")
    assert read_tokens(str(path), {TOKENS_ENV: "gamma, ,delta"}) == ["alpha-token", "beta-token", "gamma", "delta"]
    tokens = ApiTokens.load(str(path), {TOKENS_ENV: "gamma"})
    for good in ("Bearer alpha-token", "bearer beta-token", "BEARER gamma", "  Bearer   gamma "):
        tokens.check(good)


@pytest.mark.parametrize("header", [None, "", "Bearer", "Bearer ", "Basic alpha-token", "alpha-token",
                                    "Bearer alpha-tokenx", "Bearer ALPHA-TOKEN", "Bearer alpha"])
def test_a_missing_or_wrong_token_is_refused_without_echoing_it(header):
    tokens = ApiTokens.of(["alpha-token"])
    with pytest.raises(AuthenticationError) as error:
        tokens.check(header)
    assert str(error.value) in {"missing bearer token (send 'authorization: Bearer <token>')",
                                "invalid bearer token"}


def test_a_missing_tokens_file_or_a_token_with_whitespace_is_a_configuration_error(tmp_path):
    with pytest.raises(ValueError, match="api_tokens_file"):
        ApiTokens.load(str(tmp_path / "absent"), {})
    with pytest.raises(ValueError, match="whitespace"):
        ApiTokens.of(["two words"])


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def after(self, seconds: float) -> "Clock":
        self.now += seconds
        return self


def served(path, clock):
    """A TokenSource on `path`, read again at most every second of `clock`."""
    return TokenSource(str(path), environ={}, recheck_s=1.0, clock=clock)


def settle(source, clock):
    """Two rechecks: a changed file is taken once it stayed the same for one of them."""
    for _ in range(2):
        clock.after(1.0)
        source.current()


def test_a_rotated_tokens_file_is_read_again_without_a_restart(tmp_path):
    path = tmp_path / "tokens"
    path.write_text("old-token\n")
    clock = Clock()
    source = served(path, clock)
    source.check("Bearer old-token")
    path.write_text("old-token\nnew-token\n")  # step 1: add the new token
    clock.after(0.5)
    with pytest.raises(AuthenticationError):
        source.check("Bearer new-token")  # not re-read within recheck_s
    settle(source, clock)
    source.check("Bearer new-token")
    path.write_text("new-token\n")  # step 2: remove the old one
    settle(source, clock)
    source.check("Bearer new-token")
    with pytest.raises(AuthenticationError):
        source.check("Bearer old-token")


def test_a_file_caught_half_way_through_a_rewrite_is_not_taken(tmp_path):
    path = tmp_path / "tokens"
    path.write_text("alpha-token\n")
    clock = Clock()
    source = served(path, clock)
    path.write_text("alpha-token\nbe")  # the writer is still writing
    clock.after(1.0)
    with pytest.raises(AuthenticationError):
        source.check("Bearer be")
    path.write_text("alpha-token\nbeta-token\n")  # ... and finishes before the next check
    clock.after(1.0)
    with pytest.raises(AuthenticationError):
        source.check("Bearer be")
    settle(source, clock)
    source.check("Bearer beta-token")


def emptied(path):
    path.write_text("")


def truncated(path):
    path.write_text("alpha-to")


def deleted(path):
    path.unlink()


def unreadable(path):
    path.chmod(0)


def malformed(path):
    path.write_bytes(b"\xff\xfe not utf-8\n")


@pytest.mark.parametrize("damage", [emptied, truncated, deleted, unreadable, malformed])
def test_a_tokens_file_that_goes_bad_while_serving_keeps_the_last_good_tokens_and_logs(tmp_path, caplog, damage):
    path = tmp_path / "tokens"
    path.write_text("alpha-token\n")
    clock = Clock()
    source = served(path, clock)
    damage(path)
    for _ in range(5):  # checked again and again: authentication never turns off
        clock.after(1.0)
        assert source.enabled
        for refused in (None, "", "Bearer ", "Bearer anything", "Bearer alpha-to"):
            with pytest.raises(AuthenticationError):
                source.check(refused)
        source.check("Bearer alpha-token")
    if damage is not unreadable or os.geteuid() != 0:  # root reads a mode-000 file (nothing went bad)
        errors = [r for r in caplog.records if r.levelname == "ERROR" and "keeping the last good tokens" in r.message]
        assert len(errors) == 1, "logged once, not on every check"
    path.chmod(0o600) if path.exists() else None
    path.write_text("alpha-token\nbeta-token\n")  # a good file again is taken
    settle(source, clock)
    source.check("Bearer beta-token")


@pytest.mark.parametrize("content", ["", "\n# only a comment\n"])
def test_a_configured_tokens_file_without_a_token_is_a_configuration_error(tmp_path, content):
    path = tmp_path / "tokens"
    path.write_text(content)
    with pytest.raises(ValueError, match="holds no token"):
        TokenSource(str(path), environ={})
    with pytest.raises(ValueError, match="holds no token"):
        check_security_files(SecurityConfig(api_tokens_file=str(path)))
