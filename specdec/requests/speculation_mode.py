"""A request's speculation mode, and the one rule for the γ a request fixes for itself.

AUTO: the server's policy chooses each round's γ (following load); ON: always speculate;
OFF: plain decoding, no draft calls. The modes are a StrEnum, so "auto" == AUTO: the
protocols translate their own names (a JSON string, a proto enum) into these.
"""

from __future__ import annotations

from enum import StrEnum

from specdec.requests.errors import InvalidRequestError


class SpeculationMode(StrEnum):
    AUTO = "auto"
    ON = "on"
    OFF = "off"

    @classmethod
    def parse(cls, value: object) -> "SpeculationMode":
        """The mode named `value`; InvalidRequestError naming speculation.mode otherwise."""
        if type(value) is cls:  # already parsed (every round reads a row's mode): no enum lookup
            return value
        try:
            return cls(value)
        except ValueError:
            names = ", ".join(mode.value for mode in cls)
            raise InvalidRequestError("speculation.mode", f"must be one of {names}, got {value!r}") from None


def never_drafts(mode: SpeculationMode, requested: int | None) -> bool:
    """Whether a request fixes γ 0 for itself for good: mode OFF, or a requested γ of 0."""
    return mode == SpeculationMode.OFF or requested == 0


def own_gamma(mode: SpeculationMode, requested: int | None, default_gamma: int, speculating: bool) -> int | None:
    """The γ a row fixes for itself this round, or None where the policy chooses.

    OFF or a requested γ of 0: none. ON: its own γ, else the server's. AUTO with its own γ:
    that γ while speculation is on (`speculating`: the policy's on/off state; without a
    policy, whether the server speculates at all), else none. AUTO without one: the policy's
    choice (None)."""
    if never_drafts(mode, requested):
        return 0
    if mode == SpeculationMode.ON:
        return requested or default_gamma
    if requested is not None:
        return requested if speculating else 0
    return None
