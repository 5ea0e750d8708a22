"""The engine follows its round policy: γ per round, no draft calls while off, correct catch-up when on again."""

import time

from specdec.policy.load_stats import RoundSample
from specdec.policy.round_cost import RoundCostModel
from specdec.proposers.base import Drafts
from specdec.requests.request import GenerationRequest
from specdec.policy.row_state import RowState
from specdec.policy.speculation_policy import Decision


class TogglingPolicy:
    """Speculation on for `period` rounds, off for `period` rounds, and so on, for every row."""

    def __init__(self, period: int, gamma: int = 4):
        self.period, self.gamma, self.rounds = period, gamma, 0
        self.samples: list[RoundSample] = []

    def on_arrival(self, count: int = 1) -> None:
        pass

    def set_load(self, in_flight: int, queued: int) -> None:
        pass

    def plan(self, rows: list[RowState], default_gamma: int) -> Decision:
        on = (self.rounds // self.period) % 2 == 0
        self.rounds += 1
        gamma = self.gamma if on else 0
        return Decision(gamma, on, "toggle", (gamma,) * len(rows))

    def record(self, sample: RoundSample) -> None:
        self.samples.append(sample)


class CountingProposer:
    def __init__(self, inner):
        self.inner, self.calls, self.names = inner, 0, inner.names

    def propose(self, requests):
        self.calls += 1
        return self.inner.propose(requests)

    def release(self, seq_id):
        self.inner.release(seq_id)


def test_requests_living_through_switches_keep_the_target_greedy_output(make_engine, prompt_ids, hf_greedy):
    built = make_engine("draft", gamma=4)
    built.engine.policy = TogglingPolicy(period=3)
    results = built.engine.generate([GenerationRequest(p, 48) for p in prompt_ids[:3]])
    assert [r.token_ids for r in results] == [hf_greedy(p, 48) for p in prompt_ids[:3]]


def test_off_rounds_make_no_draft_calls(make_engine, prompt_ids):
    built = make_engine("draft", gamma=4)
    policy = TogglingPolicy(period=2)
    counting = CountingProposer(built.engine.proposer)
    built.engine.proposer, built.engine.policy = counting, policy
    built.engine.generate([GenerationRequest(prompt_ids[0], 40, ignore_eos=True)])
    on_rounds = sum(1 for s in policy.samples if s.gamma > 0)
    assert counting.calls == on_rounds < len(policy.samples)
    assert all(s.drafted == 0 for s in policy.samples if s.gamma == 0)


def test_the_draft_catches_up_after_speculation_was_off(make_engine, prompt_ids):
    """Stale draft state after re-enabling would collapse acceptance; catch-up keeps it."""
    steady = make_engine("draft", gamma=4)
    [plain] = steady.engine.generate([GenerationRequest(prompt_ids[1], 96, ignore_eos=True)])
    toggled = make_engine("draft", gamma=4)
    toggled.engine.policy = TogglingPolicy(period=4)
    [switched] = toggled.engine.generate([GenerationRequest(prompt_ids[1], 96, ignore_eos=True)])
    assert switched.token_ids == plain.token_ids
    assert switched.stats.acceptance_rate >= 0.8 * plain.stats.acceptance_rate


def test_round_samples_describe_the_batch(make_engine, prompt_ids):
    built = make_engine("draft", gamma=3)
    policy = TogglingPolicy(period=1000, gamma=3)
    built.engine.policy = policy
    built.engine.generate([GenerationRequest(p, 16, ignore_eos=True) for p in prompt_ids[:2]])
    first = policy.samples[0]
    assert first.batch_size == 2 and first.gamma == 3 and first.drafted == 6
    assert first.verify_seconds > 0 and first.draft_seconds > 0
    assert sum(s.accepted for s in policy.samples) == built.engine.stats.accepted


def test_a_seeded_sampled_request_gives_the_same_output_whatever_the_policys_schedule(make_engine, prompt_ids):
    """The policy plans a seeded sampled request freely (γ toggled every round, every 3rd
    round, or never drafting): its tokens do not depend on it (specdec.sampling.gumbel_sampling)."""
    from specdec.sampling.sampling_params import SamplingParams

    sampling = SamplingParams(temperature=0.9, seed=7)
    outputs, drafted = [], []
    for period, gamma in ((1, 4), (3, 4), (1, 0)):  # two schedules, then no drafts at all
        built = make_engine("draft", gamma=4)
        built.engine.policy = TogglingPolicy(period=period, gamma=gamma)
        [r] = built.engine.generate([GenerationRequest(prompt_ids[0], 24, sampling, ignore_eos=True)])
        outputs.append(r.token_ids)
        drafted.append(r.stats.drafted)
    assert drafted[0] > 0 and drafted[1] > 0 and drafted[2] == 0
    assert outputs[0] == outputs[1] == outputs[2]


class BrokenPolicy(TogglingPolicy):
    def plan(self, rows, default_gamma):
        raise RuntimeError("policy bug")


def test_a_failing_policy_costs_the_round_its_plan_not_the_requests(make_engine, prompt_ids, hf_greedy):
    built = make_engine("draft", gamma=3)
    built.engine.policy = BrokenPolicy(period=1)
    [r] = built.engine.generate([GenerationRequest(prompt_ids[0], 24)])
    assert r.token_ids == hf_greedy(prompt_ids[0], 24)
    assert r.stats.drafted > 0  # the static γ was used


class PoorProposer:
    """Drafts tokens the target almost never picks (like an untrained draft)."""

    names, has_probs, unavailable_reason = ("draft",), False, None

    def __init__(self):
        self.drafted = 0

    def unavailable(self, name):
        return None

    def propose(self, requests):
        ids = [[(r.token_ids[-1] * 7 + 13 + k) % 50 for k in range(r.gamma)] for r in requests]
        self.drafted += sum(len(i) for i in ids)
        return [Drafts(i) for i in ids]

    def release(self, seq_id):
        pass


# an accelerator's round: a memory-bound target forward (~20 ms whatever the batch) and a
# draft step of a small model beside it; what the policy prices rounds by in the test below
DEVICE = RoundCostModel(verify=(0.020, 0.0001, 0.0001, 0.00005, 0.0), draft=(0.0005, 0.003, 0.0001, 0.00002))


class DeviceTimedRounds:
    """The engine's LoadMonitor, told each round's seconds as `device` prices the round's
    shape, on a clock that runs by those seconds: the monitor prices rounds (and paces its
    ticks and explorations) by measured wall time, and on the test machine's CPU the bundled
    pair's speculation gain is small enough that a loaded CPU tips the measured costs
    either way. What it plans is then the policy's answer to acceptance alone."""

    def __init__(self, monitor, device: RoundCostModel):
        self.monitor, self.device, self.now = monitor, device, 0.0
        monitor.clock = lambda: self.now

    def record(self, sample: RoundSample) -> None:
        from dataclasses import replace

        shape = sample.shape
        verify_s = self.device.verify_s(shape.rows, shape.drafted, shape.prompt_tokens)
        draft_s = self.device.draft_s(shape.draft_rows, shape.steps, shape.catch_up)
        round_s = verify_s + draft_s + self.device.overhead_s
        self.now += round_s  # every row in the round waited it since its last emission
        self.monitor.record(replace(sample, verify_seconds=verify_s, draft_seconds=draft_s, round_seconds=round_s,
                                    waited_seconds=sample.waited_rows * round_s))

    def __getattr__(self, name):  # plan, plan_ahead, set_load, on_arrival: the monitor's own
        return getattr(self.monitor, name)


def test_the_in_process_engine_plans_gamma_by_goodput_by_default(make_engine, prompt_ids, hf_greedy):
    """With a poor proposer the policy mostly decodes plainly (exploring now and then); with
    the bundled draft it speculates. Either way the output is the target's. Both run on the
    same emulated device's round costs (`DeviceTimedRounds`): acceptance makes the difference."""
    from specdec.policy.load_monitor import LoadMonitor

    poor = make_engine("draft", gamma=4, load_monitor={"enabled": True})
    assert isinstance(poor.engine.policy, LoadMonitor)
    poor.engine.proposer = PoorProposer()
    poor.engine.policy = DeviceTimedRounds(poor.engine.policy, DEVICE)
    [r] = poor.engine.generate([GenerationRequest(prompt_ids[0], 96, ignore_eos=True)])
    assert r.token_ids == hf_greedy(prompt_ids[0], 96)
    assert r.stats.drafted < 0.25 * 4 * r.stats.rounds, "mostly plain rounds"
    good = make_engine("draft", gamma=4, load_monitor={"enabled": True})
    good.engine.policy = DeviceTimedRounds(good.engine.policy, DEVICE)
    [g] = good.engine.generate([GenerationRequest(prompt_ids[0], 96, ignore_eos=True)])
    assert g.token_ids == r.token_ids and g.stats.mean_accepted_length > 1.5


class RowRecorder(TogglingPolicy):
    def __init__(self):
        super().__init__(period=1)
        self.seen: list[list[RowState]] = []

    def plan(self, rows, default_gamma):
        self.seen.append(list(rows))
        return super().plan(rows, default_gamma)


def test_the_policy_hears_the_prompt_a_row_brings_to_its_first_round_only(make_engine, prompt_ids):
    built = make_engine("draft", gamma=2)
    recorder = RowRecorder()
    built.engine.policy = recorder
    built.engine.generate([GenerationRequest(prompt_ids[0], 6, ignore_eos=True)])
    first, *later = recorder.seen
    assert [r.prompt_tokens for r in first] == [len(prompt_ids[0]) - 1]
    assert later and all(r.prompt_tokens == 0 for rows in later for r in rows)
    assert recorder.samples[0].prefill_tokens == len(prompt_ids[0]) - 1
    assert [s.prefill_rows for s in recorder.samples] == [1] + [0] * (len(recorder.samples) - 1)


def test_the_policy_hears_what_the_draft_must_catch_up_on_and_the_round_records_what_it_read(make_engine, prompt_ids):
    """Drafting every round, a row's catch-up is the tokens of its last round; after plain
    rounds it is everything since its last draft; the first time, its whole history."""
    built = make_engine("draft", gamma=2)
    recorder = RowRecorder()
    recorder.period = 2  # two drafting rounds, two plain ones, ...
    built.engine.policy = recorder
    built.engine.generate([GenerationRequest(prompt_ids[0], 20, ignore_eos=True)])
    seen = [rows[0].catch_up_tokens for rows in recorder.seen]
    emitted = [s.accepted + 1 for s in recorder.samples]
    assert seen[0] == len(prompt_ids[0])  # nothing seen yet
    assert recorder.samples[0].catch_up_tokens == len(prompt_ids[0])
    assert seen[1] == emitted[0]  # drafted last round: only what that round emitted
    assert seen[4] == sum(emitted[1:4])  # after two plain rounds: those rounds' tokens too
    assert all(s.catch_up_tokens == 0 for s in recorder.samples if s.gamma == 0)


class PricedPolicy(TogglingPolicy):
    """Prices each plan: the k-th (from 1) is predicted to take k ms."""

    def plan(self, rows, default_gamma):
        from dataclasses import replace

        return replace(super().plan(rows, default_gamma), planned_s=0.001 * (self.rounds), decode_s=0.002)


def test_each_round_reports_what_its_plan_predicted_it_would_take(make_engine, prompt_ids):
    built = make_engine("draft", gamma=2)
    policy = PricedPolicy(period=2)
    built.engine.policy = policy
    built.engine.generate([GenerationRequest(prompt_ids[0], 8, ignore_eos=True)])
    assert [s.planned_seconds for s in policy.samples] == [0.001 * (k + 1) for k in range(len(policy.samples))]
    assert all(s.round_seconds > 0 for s in policy.samples)
    # and what its rows waited since they last emitted, beside the decoding round it priced
    assert [s.waited_rows for s in policy.samples] == [0] + [1] * (len(policy.samples) - 1)
    assert all(s.waited_seconds > 0 and s.decode_seconds == 0.002 for s in policy.samples[1:])


def test_a_round_is_timed_from_where_the_last_one_ended_while_rows_keep_running(make_engine, prompt_ids):
    """What the loop does between two rounds (handing outputs to the streams) is part of
    every round's cost; a pause with nothing running is not."""
    import time

    pause = 0.2  # seconds; far above a round's own overhead beside its forwards, even on a slow CI core

    def overhead(sample):  # what the round took beside its draft and verify forwards
        return sample.round_seconds - sample.draft_seconds - sample.verify_seconds

    built = make_engine("draft", gamma=2)
    policy = TogglingPolicy(period=2)
    built.engine.policy = policy
    built.engine.add_request(GenerationRequest(prompt_ids[0], 12, ignore_eos=True))
    built.engine.step()
    time.sleep(pause)  # the loop's work between rounds
    built.engine.step()
    while built.engine.has_unfinished():
        built.engine.step()
    time.sleep(pause)  # idle: nothing running
    built.engine.add_request(GenerationRequest(prompt_ids[1], 2, ignore_eos=True))
    built.engine.step()
    first, second, *_, after_idle = policy.samples
    assert overhead(second) >= pause > overhead(first)
    assert overhead(after_idle) < pause
    profiled = built.engine.profile
    assert profiled.rounds == len(policy.samples) and profiled.round_s < sum(s.round_seconds for s in policy.samples)


class LateProposer(CountingProposer):
    """Drafts as its inner proposer, except while `late`: then the call takes `wait_s` and
    brings no drafts, saying why (a remote draft that missed its deadline)."""

    def __init__(self, inner, wait_s: float):
        super().__init__(inner)
        self.wait_s, self.late = wait_s, False

    def propose(self, requests):
        if not self.late:
            return super().propose(requests)
        time.sleep(self.wait_s)
        return [Drafts() for _ in requests]

    def unavailable(self, name):
        return "draft worker missed its deadline" if self.late else None


def test_a_round_whose_drafts_missed_is_no_measurement_of_what_drafting_costs(make_engine, prompt_ids):
    """Its wait would price every later draft call (a draft paused for 30 s once kept AUTO
    off after it came back): the round is recorded as a plain one, and not as a priced plan."""
    built = make_engine("draft", gamma=4)
    policy = PricedPolicy(period=1000)
    late = LateProposer(built.engine.proposer, wait_s=0.2)
    built.engine.proposer, built.engine.policy = late, policy
    built.engine.add_request(GenerationRequest(prompt_ids[0], 40, ignore_eos=True))
    built.engine.step()
    late.late = True
    built.engine.step()
    on_time, missed = policy.samples
    assert on_time.draft_rows == 1 and on_time.gamma == 4 and on_time.planned_seconds > 0
    assert missed.draft_seconds >= 0.2, "the round did wait"
    assert missed.draft_rows == 0 and missed.gamma == 0 and missed.planned_seconds == 0
