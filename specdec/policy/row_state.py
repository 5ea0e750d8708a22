"""RowState: what the round policy sees of one row of a round (its request's speculation
settings, its cap, its acceptance so far, its catch-up, its TPOT target)."""

from __future__ import annotations

from dataclasses import dataclass

from specdec.requests.speculation_mode import SpeculationMode


@dataclass(frozen=True)
class RowState:
    """What the policy needs to know about one row of the round.

    mode / requested_gamma: the request's speculation settings (None = not set);
    cap: the most γ it may draft now (budget, context, caps); drafted / accepted: its own
    counts so far; drafted_per_position[k]: its rounds that offered a (k + 1)-th drafted
    token (() = unknown: its drafts are taken to lie where the cluster's do); seq_id: names
    it in logs and previews; prompt_tokens: what the target reads for it this round besides
    its γ + 1 tokens (its prompt, in its first round);
    catch_up_tokens: what the proposer would read of its history before drafting for it
    (all of it the first time, everything decoded plainly since its last draft);
    remaining_tokens: the most tokens it may still emit (0 = unknown);
    tpot_target_s: its request's time-per-output-token target, seconds (None = the server's).
    """

    mode: SpeculationMode  # (a plain "auto" | "on" | "off" compares equal)
    requested_gamma: int | None
    cap: int
    drafted: int = 0
    accepted: int = 0
    seq_id: str = ""
    prompt_tokens: int = 0
    catch_up_tokens: int = 0
    remaining_tokens: int = 0
    drafted_per_position: tuple[int, ...] = ()
    tpot_target_s: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", SpeculationMode.parse(self.mode))
