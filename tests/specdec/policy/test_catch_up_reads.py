"""What drafting rows read beyond the catch-up their plans charged (`CatchUpReads`), and the
plan that prices it: at a full batch under a target just above plain decoding's TPOT."""

from specdec.policy.catch_up_reads import CatchUpReads
from specdec.policy.load_stats import LoadSnapshot
from specdec.policy.policy_settings import PolicySettings
from specdec.policy.round_cost import RoundCostModel
from specdec.policy.row_state import RowState
from specdec.policy.speculation_policy import SpeculationPolicy

# the served emulated 8B/1B pair at time scale 8 (router's fit at 10 requests/s, docs/goodput.md):
# a 55 ms target call and a prompt step, an 11 ms draft step, 0.05 ms per history token read
SERVED = RoundCostModel(verify=(0.0552, 0.000129, 0.000132, 0.000135, 0.0, 0.0347),
                        draft=(0.00275, 0.0112, 0.000154, 0.000053), overhead_s=0.0009,
                        drafting_scale=0.99, plain_scale=1.03, wait_scale=1.37)


def test_only_drafting_rows_count_and_the_extra_is_their_mean_read_beyond_the_charge():
    reads = CatchUpReads()
    assert reads.extra() == 0.0
    reads.record([0] * 40, [40] * 40, [1.0] * 40)  # a plain plan: nothing read
    reads.record([1] * 8, [9] * 8, [1.0] * 8)  # a few rows: not yet a mean
    assert reads.extra() == 0.0
    reads.record([1] * 32 + [0], [8, 10] * 16 + [500], [0.5, 1.5] * 16 + [9.0])  # the plain row reads nothing
    assert abs(reads.extra() - 8.0) < 0.1
    reads.record([2] * 32, [1] * 32, [1.0] * 32)  # rows drafting round after round: nothing beyond
    assert 0.0 < reads.extra() < 5.0


def rows(n, catch_up):
    return [RowState("auto", None, 8, seq_id=f"s{i}", catch_up_tokens=catch_up, remaining_tokens=30)
            for i in range(n)]


def plan_twice(target_s):
    """Two rounds of 32 rows whose drafts have 8 tokens each unread (what a newcomer's prompt
    and the rounds decoded plainly leave per row, as served): the first plan charges each
    row its catch-up spread over 30 tokens to go, the second also what the first one's rows read."""
    policy = SpeculationPolicy(PolicySettings(gamma_max=8, fallback_gamma=2, stale_after_s=5.0, min_gain=0.05,
                                              min_dwell_s=1.0, explore_interval_s=0, tpot_target_s=target_s))
    snapshot = LoadSnapshot(qps=10.0, in_flight=32, queued=0, alpha=0.7, alpha_per_position=(),
                            mean_accepted_length=2.0, round_cost=SERVED, measured_at=100.0, drafted=1000.0,
                            draft_calls=100.0, mean_batch=32.0, token_rate=400.0)
    first = policy.plan(snapshot, rows(32, 8), 100.0, 4)
    return first, policy.plan(snapshot, rows(32, 8), 100.0, 4)


def test_a_plan_that_drafted_pays_for_what_its_rows_read_and_decodes_plainly_where_that_is_near_the_target():
    """Under 95 ms (plain decoding predicted at 0.9x it) drafting γ 1 looks 1.26x plain decoding's
    tokens/s and far within the target with catch-up charged as spread; with what the rows read
    charged, its TPOT nears the target and plain decoding keeps more rows within (old code: γ 1 again)."""
    first, second = plan_twice(0.095)
    assert max(first.gammas) == 1 and first.extra_read == 0.0
    assert max(second.gammas) == 0 and second.extra_read > 7.0
    assert "read 7 tokens more" in second.reason or "read 8 tokens more" in second.reason


def test_where_plain_decoding_misses_the_target_the_plan_still_drafts_after_paying_its_reads():
    """Under 75 ms plain decoding's TPOT is over the target: the plan drafts in both rounds."""
    first, second = plan_twice(0.075)
    assert min(first.gammas) >= 1 and min(second.gammas) >= 1 and second.extra_read > 7.0


def test_the_on_off_state_is_judged_with_what_drafting_rows_read():
    """Judged at the 32 rows the demand keeps in flight, speculation pays with catch-up charged
    as spread; after plans whose rows read 8 tokens more each it is switched off (while on, the
    draft also reads the prompts of rows planned plainly; old code: it stays on)."""
    policy = SpeculationPolicy(PolicySettings(gamma_max=8, fallback_gamma=2, stale_after_s=5.0, min_gain=0.05,
                                              min_dwell_s=0.0, explore_interval_s=0, tpot_target_s=0.095))
    snapshot = LoadSnapshot(qps=10.0, in_flight=32, queued=0, alpha=0.7, alpha_per_position=(),
                            mean_accepted_length=2.0, round_cost=SERVED, measured_at=100.0, drafted=1000.0,
                            draft_calls=100.0, mean_batch=32.0, token_rate=400.0)
    assert policy.update_switch(snapshot, 32, 100.0)
    assert max(policy.plan(snapshot, rows(32, 8), 100.0, 4).gammas) == 1
    assert not policy.update_switch(snapshot, 32, 101.0)
