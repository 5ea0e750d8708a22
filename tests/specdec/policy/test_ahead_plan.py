"""A plan made ahead, taken by its round: the plan's γ within each row's cap, a request's own
γ where it fixes one, and for a row that joined since the γ the plan gave most rows."""

from specdec.policy.ahead_plan import NEWCOMER, taken_ahead
from specdec.policy.row_state import RowState
from specdec.policy.speculation_policy import Decision


def test_rows_take_the_plans_gamma_within_their_cap_and_newcomers_the_most_common_one():
    ahead = Decision(3, True, "goodput plan", gammas=(3, 2, 2, 4, NEWCOMER, NEWCOMER), catch_up=(1.0,) * 6)
    rows = [RowState("auto", None, 8, seq_id=f"s{i}") for i in range(4)]
    rows[0] = RowState("auto", None, 1, seq_id="near its end")
    newcomers = [RowState("auto", None, 8, seq_id="new", catch_up_tokens=40, remaining_tokens=30),
                 RowState("off", None, 8, seq_id="new, plain")]
    fixed = [None] * 5 + [0]
    lo = [0] * 6
    hi = [1, 8, 8, 8, 8, 0]
    gammas, catch_up = taken_ahead(ahead, [*rows, *newcomers], fixed, lo, hi)
    assert gammas == [1, 2, 2, 4, 2, 0]
    assert catch_up[:4] == (1.0,) * 4 and catch_up[4] == 40 / (30 / 3)  # its history over its rounds left
