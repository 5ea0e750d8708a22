"""Counter-based random numbers: a uniform is a pure function of (seed, position, role).

A request's randomness must not depend on anything but the request itself. A stateful
generator does: its stream advances with every draw, so the number a draw gets depends on
how many draws came before (the batch's γ, a retried call, a worker restart that re-seeds
it and replays numbers already used). Here every uniform is instead *addressed*:

    u(seed, position, role) in [0, 1), float64, on the grid k * 2**-53

* seed - the request's 64-bit seed (an unseeded request gets a random one);
* position - the index in the sequence's history (prompt + generated) of the token that
  the draw decides;
* role - which decision at that position: the draft's sample, the acceptance test of the
  drafted token, or the target's recovered / bonus / plain token.

A seeded sampled request instead draws one uniform per vocabulary token at each position
(`token_uniforms`, role ROLE_GUMBEL: its Gumbel noise, `specdec.sampling.gumbel_sampling`), which
the draft and the target share.

Each position's token is decided once per role, so no number is ever used twice, and a
restarted worker draws exactly the numbers the lost one would have drawn.

The hash is SplitMix64's finaliser (a bijection on 64-bit words, Steele et al. 2014),
applied to the key, then to the key mixed with the role, then with the position; its
53 high bits become the float64 uniform, so every value k * 2**-53 has probability 2**-53.
"""

from __future__ import annotations

import numpy as np

ROLE_DRAFT = 1  # the draft model samples its token at this position
ROLE_ACCEPT = 2  # the acceptance test of the drafted token at this position
ROLE_FINAL = 3  # the target's recovered, bonus or plain token at this position
ROLE_GUMBEL = 4  # a seeded sampled request's noise per vocabulary token at this position

MAX_SEED = 2**64 - 1  # seeds are uint64
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # 2**64 / golden ratio: SplitMix64's increment
_ROLE_SALT = 0xD1B54A32D192ED03
_MUL1 = np.uint64(0xBF58476D1CE4E5B9)
_MUL2 = np.uint64(0x94D049BB133111EB)
_TO_UNIT = 2.0**-53


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on uint64 words (arithmetic wraps modulo 2**64)."""
    x = (x ^ (x >> np.uint64(30))) * _MUL1
    x = (x ^ (x >> np.uint64(27))) * _MUL2
    return x ^ (x >> np.uint64(31))


def as_seeds(seeds) -> np.ndarray:
    """Seeds (ints in [0, 2**64)) as a uint64 array; ValueError outside that range."""
    values = list(np.atleast_1d(np.asarray(seeds, dtype=object)))
    if any(isinstance(s, bool) or not isinstance(s, (int, np.integer)) or not 0 <= s <= MAX_SEED for s in values):
        raise ValueError(f"seeds must be integers in [0, 2**64), got {values}")
    return np.array([int(s) for s in values], dtype=np.uint64)


def uniforms(seeds: np.ndarray, positions: np.ndarray, role: int) -> np.ndarray:
    """Uniforms in [0, 1) as float64, one per (seed, position) pair.

    seeds: [B] uint64 (see as_seeds); positions: [B] or [B, n] non-negative int64 (row b
    uses seeds[b]); role: ROLE_DRAFT, ROLE_ACCEPT or ROLE_FINAL.
    Returns an array shaped like `positions`.
    """
    positions = np.asarray(positions, dtype=np.int64)
    return _to_unit(_position_words(seeds, positions, role))


def token_uniforms(seeds: np.ndarray, positions: np.ndarray, vocab: int) -> np.ndarray:
    """Uniforms in [0, 1) as float64, one per (seed, position, token): role ROLE_GUMBEL.

    seeds: [B] uint64; positions: [B] or [B, n] non-negative int64 (row b uses seeds[b]);
    vocab: V. Returns [*positions.shape, V]: entry [..., v] is the uniform of token v at
    that position, a pure function of (seed, position, v) like every other uniform here.
    """
    assert vocab > 0, "vocab must be positive"
    words = _position_words(seeds, np.asarray(positions, dtype=np.int64), ROLE_GUMBEL)[..., None]  # [..., 1]
    tokens = np.arange(vocab, dtype=np.uint64) * _GOLDEN  # [V]
    return _to_unit(_mix(words + tokens))  # [..., V]


def _position_words(seeds: np.ndarray, positions: np.ndarray, role: int) -> np.ndarray:
    """The hashed 64-bit word of each (seed, position) in the given role, like positions."""
    assert seeds.dtype == np.uint64 and seeds.ndim == 1, "seeds must be [B] uint64"
    assert positions.shape[:1] == seeds.shape, f"positions must be [B={seeds.shape[0]}, ...], got {positions.shape}"
    assert (positions >= 0).all(), "positions must be >= 0"
    key = _mix(seeds + _GOLDEN)  # [B]
    key = _mix(key ^ np.uint64(role * _ROLE_SALT % 2**64))  # [B]
    key = key.reshape(key.shape + (1,) * (positions.ndim - 1))  # broadcast over n
    return _mix(key + positions.astype(np.uint64) * _GOLDEN)  # like positions


def _to_unit(words: np.ndarray) -> np.ndarray:
    """The 53 high bits of uint64 words as float64 uniforms k * 2**-53 in [0, 1)."""
    return (words >> np.uint64(11)).astype(np.float64) * _TO_UNIT
