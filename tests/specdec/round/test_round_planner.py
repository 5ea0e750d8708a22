"""A round's γ per row: the policy's plan or the static γ, never past a row's cap, and what a
round records of it."""

import pytest

from specdec.policy.speculation_policy import Decision
from specdec.proposers.proposer_view import ProposerView
from specdec.requests.request import GenerationRequest
from specdec.round import round_planner
from specdec.round.round_planner import RoundPlanner, unread_prompt
from specdec.sampling.sampling_params import SamplingParams
from specdec.requests.sequence import Sequence
from specdec.requests.stop_conditions import StopChecker


def seq(seq_id, prompt=(1, 2, 3), max_new=32, **request):
    req = GenerationRequest(prompt_token_ids=prompt, max_new_tokens=max_new, **request)
    return Sequence(seq_id, req, StopChecker(max_new))


class PlanEverything:
    """A policy that gives every row `gamma` and notes the load it was told."""

    def __init__(self, gamma, extra_rows=0):
        self.gamma, self.extra_rows, self.loads = gamma, extra_rows, []

    def set_load(self, running, waiting):
        self.loads.append((running, waiting))

    def plan(self, rows, default_gamma):
        return Decision(self.gamma, True, "test", (self.gamma,) * (len(rows) + self.extra_rows), planned_s=0.01)


def test_without_a_policy_every_row_gets_the_static_gamma_or_its_own():
    planner = RoundPlanner(4, 8, ProposerView())
    batch = [seq("a"), seq("b", gamma=2), seq("c", mode="off")]
    planner.plan(batch, None, max_seq_len=512, load=(3, 0))
    assert [planner.gamma_for(s) for s in batch] == [4, 2, 0]
    assert planner.decision.reason == "static γ"


def test_the_plan_never_drafts_past_max_new_tokens_or_the_context():
    planner = RoundPlanner(4, 8, ProposerView())
    short, near_the_end, roomy = seq("a", max_new=3), seq("b", prompt=tuple(range(60))), seq("c")
    policy = PlanEverything(8)
    planner.plan([short, near_the_end, roomy], policy, max_seq_len=64, load=(3, 1))
    # 3 tokens left: 2 drafts and the bonus; 4 positions of context left: 4 drafts
    assert [planner.gamma_for(s) for s in (short, near_the_end, roomy)] == [2, 4, 8]
    assert policy.loads == [(3, 1)]
    assert planner.gamma_for(seq("not in the batch")) == 0


def test_without_a_policy_the_caps_hold_and_no_row_state_is_built(monkeypatch):
    """The rows' states are what a policy reads; without one they are not made every round."""
    def no_row_state(*args, **kwargs):
        raise AssertionError("a RowState built without a policy")

    monkeypatch.setattr(round_planner, "RowState", no_row_state)
    planner = RoundPlanner(8, 8, ProposerView())
    short, near_the_end, roomy = seq("a", max_new=3), seq("b", prompt=tuple(range(60))), seq("c")
    planner.plan([short, near_the_end, roomy], None, max_seq_len=64, load=(3, 0))
    assert [planner.gamma_for(s) for s in (short, near_the_end, roomy)] == [2, 4, 8]
    assert [planner.recorded_gamma(s) for s in (short, near_the_end, roomy)] == [0, 0, 8]  # cut: the last uncut γ


def test_a_policy_that_fails_or_plans_other_rows_costs_the_round_its_plan_only():
    planner = RoundPlanner(3, 8, ProposerView())
    batch = [seq("a"), seq("b")]
    planner.plan(batch, PlanEverything(6, extra_rows=1), max_seq_len=512, load=(2, 0))
    assert [planner.gamma_for(s) for s in batch] == [3, 3]
    assert planner.decision.reason == "static γ"


def test_a_seeded_sampled_request_is_planned_like_any_row_and_its_prompt_is_read_in_its_first_round_only():
    """Its output does not depend on the schedule (specdec.sampling.gumbel_sampling), so the policy
    sees it exactly as it sees an unseeded row and plans it freely."""
    planner = RoundPlanner(4, 8, ProposerView())
    seeded = seq("a", prompt=(5, 6, 7, 8), sampling=SamplingParams(temperature=1.0, seed=7))
    unseeded = seq("a", prompt=(5, 6, 7, 8), sampling=SamplingParams(temperature=1.0))
    assert planner.row_state(seeded, 512) == planner.row_state(unseeded, 512)
    policy = PlanEverything(6)
    planner.plan([seeded, seq("b")], policy, max_seq_len=512, load=(2, 0))
    assert planner.gamma_for(seeded) == 6  # not the static γ 4
    assert unread_prompt(seeded) == 3  # the last prompt token is the pending one, read with the drafts
    seeded.stats.rounds = 1
    assert unread_prompt(seeded) == 0


def test_a_row_cut_short_by_its_cap_records_its_last_uncut_gamma():
    planner = RoundPlanner(4, 8, ProposerView())
    ending, free = seq("a", max_new=3), seq("b")
    ending.stats.gamma = 6  # what its earlier rounds drafted
    planner.plan([ending, free], PlanEverything(6), max_seq_len=512, load=(2, 0))
    assert planner.gamma_for(ending) == 2 and planner.recorded_gamma(ending) == 6
    assert planner.recorded_gamma(free) == 6


def test_the_plans_predicted_round_belongs_to_its_whole_batch_only():
    planner = RoundPlanner(4, 8, ProposerView())
    planner.plan([seq("a"), seq("b")], PlanEverything(2), max_seq_len=512, load=(2, 0))
    assert planner.planned_s(2) == 0.01
    assert planner.planned_s(1) == 0.0  # a micro-batch or a retried half is another round


def test_the_policy_sees_a_requests_tpot_target_in_seconds_and_none_where_it_set_none():
    planner = RoundPlanner(4, 8, ProposerView())
    assert planner.row_state(seq("a", tpot_target_ms=25.0), 512).tpot_target_s == pytest.approx(0.025)
    assert planner.row_state(seq("b"), 512).tpot_target_s is None


class OverSnapshot:
    """A SpeculationPolicy over a fixed snapshot, planning ahead as `LoadMonitor` does."""

    def __init__(self, policy, snap):
        self.policy, self.snap, self.ahead_threads = policy, snap, set()

    def set_load(self, running, waiting):
        pass

    def plan(self, rows, default_gamma, ahead=None):
        return self.policy.plan(self.snap, rows, 100.0, default_gamma, ahead=ahead)

    def plan_ahead(self, rows, default_gamma):
        import threading

        self.ahead_threads.add(threading.current_thread().name)
        return self.policy.plan(self.snap, rows, 100.0, default_gamma, update_state=False)


def planned_over_snapshot():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "policy"))
    from policy_snapshots import settings, snapshot

    from specdec.policy.speculation_policy import SpeculationPolicy

    snap = snapshot(alpha=0.95)
    return lambda: OverSnapshot(SpeculationPolicy(settings()), snap)


def test_the_next_rounds_plan_is_made_ahead_off_the_engine_thread_and_equals_the_plan_made_in_place():
    """Each goodput plan starts the next round's on a worker thread; the next round takes it
    and gets what planning in place for the same rows gives. Rows that finished drop out; a
    newcomer drafts the γ the plan gave most rows; a batch mostly new is planned in place."""
    fresh = planned_over_snapshot()
    batch = [seq(f"r{i}", prompt=tuple(range(3 + i))) for i in range(5)]
    for s in batch:
        s.stats.rounds = 1  # past their prompts
    policy, planner = fresh(), RoundPlanner(4, 8, ProposerView())
    planner.plan(batch, policy, max_seq_len=512, load=(5, 0))
    first = planner.decision
    assert any(first.gammas) and planner.planning.taken == 0
    in_place = RoundPlanner(4, 8, ProposerView())
    in_place.plan(batch, fresh(), max_seq_len=512, load=(5, 0))
    planner.plan(batch, policy, max_seq_len=512, load=(5, 0))  # the same rows: made ahead, as in place
    assert planner.decision == in_place.decision and planner.planning.taken == 1
    ahead = planner.decision
    planner.plan(batch[1:], policy, max_seq_len=512, load=(4, 0))  # one finished: the others' γ as planned
    assert planner.decision.gammas == ahead.gammas[1:] and planner.decision.reason == ahead.reason
    assert planner.planning.taken == 2 and policy.ahead_threads and threading_name() not in policy.ahead_threads
    joined = [*batch[1:], seq("new", prompt=tuple(range(9)))]  # one of five joined: it drafts the plan's γ
    planner.plan(joined, policy, max_seq_len=512, load=(5, 0))
    most = max(set(ahead.gammas), key=ahead.gammas.count)
    assert planner.planning.taken == 3 and planner.decision.gammas == (*ahead.gammas[1:], most)
    burst = [*batch[:2], *(seq(f"burst{i}") for i in range(3))]  # most rows new: planned in place
    planner.plan(burst, policy, max_seq_len=512, load=(5, 0))
    in_place = RoundPlanner(4, 8, ProposerView())
    in_place.plan(burst, fresh(), max_seq_len=512, load=(5, 0))
    assert planner.planning.taken == 3 and planner.decision == in_place.decision
    assert planner.planning.ahead_s > 0 and planner.planning.per_round_ms()["plan_taken_ahead"] == 0.6

def threading_name():
    import threading

    return threading.current_thread().name
