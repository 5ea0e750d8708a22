"""Bearer tokens: from a file and the environment, compared in constant time, refusals that
never echo what was sent, and no authentication when none are configured."""

import pytest

from specdec.api_auth import TOKENS_ENV, ApiTokens, AuthenticationError, read_tokens


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


def test_a_rotated_tokens_file_is_read_again_without_a_restart(tmp_path):
    from specdec.api_auth import TokenSource

    path = tmp_path / "tokens"
    path.write_text("old-token\n")
    now = [0.0]
    source = TokenSource(str(path), environ={}, recheck_s=1.0, clock=lambda: now[0])
    source.check("Bearer old-token")
    path.write_text("old-token\nnew-token\n")  # step 1: add the new token
    now[0] = 0.5
    with pytest.raises(AuthenticationError):
        source.check("Bearer new-token")  # not re-read within recheck_s
    now[0] = 1.5
    source.check("Bearer new-token")
    path.write_text("new-token\n")  # step 2: remove the old one
    now[0] = 3.0
    source.check("Bearer new-token")
    with pytest.raises(AuthenticationError):
        source.check("Bearer old-token")
    path.unlink()  # a file that disappears keeps the last tokens: never "no authentication"
    now[0] = 5.0
    source.check("Bearer new-token")
    with pytest.raises(AuthenticationError):
        source.check(None)
