"""A request only ever affects itself: per-row γ, caps, per-row failures, proposer availability.

Each test here reproduces a way in which one request used to fail or change its neighbours.
"""

from __future__ import annotations

import pytest

from specdec.requests.errors import WorkerError
from specdec.requests.request import GenerationRequest
from specdec.sampling.sampling_params import SamplingParams
from specdec.verifiers.verifier import Verifier


@pytest.fixture(scope="module")
def short_context(make_engine):
    """Draft speculation at γ = 4 on 48-token slots (target and draft)."""
    return make_engine("draft", gamma=4, cache={"max_seq_len": 48})


def test_a_request_that_nearly_fills_the_context_shares_a_round_with_a_gamma_4_request(
    short_context, prompt_ids, hf_greedy
):
    """46 prompt tokens + 2 new fill the 48-token context: that row can draft at most 1 token,
    while its neighbour drafts 4. Both finish, and the full one equals target-only greedy."""
    full = GenerationRequest(prompt_ids[1][:46], 2, ignore_eos=True)
    other = GenerationRequest(prompt_ids[3][:8], 12, ignore_eos=True)
    a, b = short_context.engine.generate([full, other])
    assert a.token_ids == hf_greedy(prompt_ids[1][:46], 2)
    assert b.token_ids == hf_greedy(prompt_ids[3][:8], 12)


def test_each_row_drafts_exactly_its_own_gamma(make_engine, prompt_ids):
    built = make_engine("draft", gamma=4)
    small = GenerationRequest(prompt_ids[0], 20, gamma=1, mode="on", ignore_eos=True)
    large = GenerationRequest(prompt_ids[1], 20, gamma=6, mode="on", ignore_eos=True)
    a, b = built.engine.generate([small, large])
    assert len(a.stats.drafted_per_position) == 1, "the γ = 1 row never drafted a second token"
    assert len(b.stats.drafted_per_position) == 6


def test_a_seeded_requests_output_does_not_depend_on_its_neighbours_gamma(make_engine, prompt_ids):
    sampled = SamplingParams(temperature=1.0, top_p=0.95, seed=2024)
    mine = GenerationRequest(prompt_ids[0], 24, sampled, gamma=2, mode="on", ignore_eos=True)
    [alone] = make_engine("draft", gamma=4).engine.generate([mine])
    neighbours = [
        GenerationRequest(prompt_ids[1], 30, gamma=7, mode="on", ignore_eos=True),
        GenerationRequest(prompt_ids[2], 10, SamplingParams(temperature=0.7, seed=1), gamma=5, mode="on"),
    ]
    crowded = make_engine("draft", gamma=4).engine.generate([neighbours[0], mine, neighbours[1]])
    assert crowded[1].token_ids == alone.token_ids


def test_gamma_above_the_cap_is_refused_naming_the_field(make_engine, prompt_ids):
    built = make_engine("draft", gamma=4, speculation={"proposer": "draft", "gamma": 4, "gamma_limit": 8})
    with pytest.raises(ValueError, match="speculation.gamma 1000 exceeds the limit 8"):
        built.engine.add_request(GenerationRequest(prompt_ids[0], 10, gamma=1000))
    [r] = built.engine.generate([GenerationRequest(prompt_ids[0], 12, gamma=8, mode="on", ignore_eos=True)])
    assert len(r.stats.drafted_per_position) <= 8


def test_a_proposer_the_server_has_not_loaded_is_refused_at_admission(make_engine, prompt_ids):
    built = make_engine("ngram", gamma=4)
    with pytest.raises(ValueError, match="speculation.proposer: 'draft' is not available here"):
        built.engine.add_request(GenerationRequest(prompt_ids[0], 10, proposer="draft"))
    assert not built.engine.has_unfinished()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"stop": tuple(f"s{i}" for i in range(17))}, "stop: 17 stop strings exceed the limit 16"),
        ({"stop": ("x" * 257,)}, "stop: a stop string of 257 characters exceeds the limit 256"),
        ({"stop_token_ids": (1, 99999)}, "stop_token_ids: ids \\[99999\\] outside the vocabulary"),
    ],
)
def test_stop_conditions_are_bounded(make_engine, prompt_ids, kwargs, match):
    built = make_engine("none", gamma=0)
    with pytest.raises(ValueError, match=match):
        built.engine.add_request(GenerationRequest(prompt_ids[0], 10, **kwargs))


def test_a_stop_token_id_ends_the_output_like_eos_and_is_kept(make_engine, prompt_ids, hf_greedy):
    built = make_engine("draft", gamma=4)
    expected = hf_greedy(prompt_ids[0], 30)
    stop_id = expected[5]
    cut = expected.index(stop_id) + 1
    [r] = built.engine.generate([GenerationRequest(prompt_ids[0], 30, stop_token_ids=(stop_id,))])
    assert (r.token_ids, r.finish_reason) == (expected[:cut], "stop")


def test_tokens_cut_away_by_a_stop_condition_are_not_counted_as_accepted(make_engine, prompt_ids, hf_greedy):
    """The accepted tokens plus one token per round are exactly the tokens kept."""
    built = make_engine("ngram", gamma=8)
    expected = hf_greedy(prompt_ids[2], 40)
    for stop_at in (3, 11, 17):
        request = GenerationRequest(prompt_ids[2], 40, stop_token_ids=(expected[stop_at],))
        [r] = built.engine.generate([request])
        s = r.stats
        assert s.accepted + s.rounds == s.emitted == len(r.token_ids)
        assert s.mean_accepted_length == pytest.approx(len(r.token_ids) / s.rounds)


class FaultyVerifier(Verifier):
    """Wraps a verifier; any call carrying `poison` fails (as a bad row would), or every call
    fails with `error` once set."""

    def __init__(self, inner: Verifier, poison: str | None = None) -> None:
        self.inner, self.poison, self.error = inner, poison, None
        self.vocab_size, self.max_seq_len = inner.vocab_size, inner.max_seq_len
        self.calls = 0

    @property
    def num_free_slots(self) -> int:
        return self.inner.num_free_slots

    def verify(self, requests):
        self.calls += 1
        if self.error is not None:
            raise self.error
        if any(r.seq_id == self.poison for r in requests):
            raise RuntimeError(f"cannot verify {self.poison}")
        return self.inner.verify(requests)

    def release(self, seq_id):
        self.inner.release(seq_id)


def test_a_row_that_fails_the_round_fails_alone_and_the_rest_keep_their_output(make_engine, prompt_ids, hf_greedy):
    built = make_engine("draft", gamma=4)
    engine = built.engine
    engine.verifier = FaultyVerifier(engine.verifier, poison="bad")
    free = engine.verifier.num_free_slots
    ids = [engine.add_request(GenerationRequest(prompt_ids[i], 16), seq_id=s) for i, s in enumerate("ab")]
    engine.add_request(GenerationRequest(prompt_ids[2], 16), seq_id="bad")
    engine.add_request(GenerationRequest(prompt_ids[3], 16), seq_id="c")
    while engine.has_unfinished():
        engine.step()
    with pytest.raises(RuntimeError, match="cannot verify bad"):
        engine.result("bad")
    for seq_id, prompt in zip([*ids, "c"], [prompt_ids[0], prompt_ids[1], prompt_ids[3]]):
        assert engine.result(seq_id).token_ids == hf_greedy(prompt, 16)
    assert engine.verifier.num_free_slots == free, "the failed request's slots were freed"


def test_a_worker_error_fails_the_whole_round_without_retrying_row_by_row(make_engine, prompt_ids):
    built = make_engine("none", gamma=0)
    engine = built.engine
    engine.verifier = FaultyVerifier(engine.verifier)
    for i in range(4):
        engine.add_request(GenerationRequest(prompt_ids[i], 8))
    engine.verifier.error = WorkerError("target unreachable")
    with pytest.raises(WorkerError):
        engine.step()
    assert engine.verifier.calls == 1


def test_a_failing_proposer_costs_the_round_its_drafts_never_a_request(make_engine, prompt_ids, hf_greedy):
    built = make_engine("draft", gamma=4)
    engine = built.engine
    draft = engine.proposer.proposers["draft"]

    def broken(requests):
        raise RuntimeError("draft device lost")

    draft.propose = broken
    [r] = engine.generate([GenerationRequest(prompt_ids[0], 12)])
    assert r.token_ids == hf_greedy(prompt_ids[0], 12)
    assert r.stats.drafted == 0 and engine.proposer_failures > 0


def test_a_target_restart_mid_request_replays_no_random_number(make_engine, prompt_ids):
    """A verifier that lost a sequence's state re-prefills it from the history; the draws at
    each position are the same as without the restart, so the output is too."""
    params = SamplingParams(temperature=1.0, seed=77)
    request = GenerationRequest(prompt_ids[1], 30, params, ignore_eos=True)
    [reference] = make_engine("draft", gamma=3).engine.generate([request])
    engine = make_engine("draft", gamma=3).engine
    seq_id = engine.add_request(request)
    for round_index in range(6):
        engine.step()
        if round_index in (1, 4):
            engine.verifier.release(seq_id)  # the target worker restarted: its state is gone
            engine.proposer.release(seq_id)
    while engine.has_unfinished():
        engine.step()
    assert engine.result(seq_id).token_ids == reference.token_ids


class RecordFailsOnce:
    """A round policy that plans γ 3 for every row and whose first `record` raises."""

    def __init__(self):
        self.records = 0

    def on_arrival(self, count=1):
        pass

    def set_load(self, in_flight, queued):
        pass

    def plan(self, rows, default_gamma):
        from specdec.policy.speculation_policy import Decision

        return Decision(3, True, "test", (3,) * len(rows))

    def record(self, sample):
        self.records += 1
        if self.records == 1:
            raise RuntimeError("the policy's bookkeeping failed")


def test_tokens_applied_in_a_round_reach_the_outputs_even_if_bookkeeping_after_them_fails(
    make_engine, prompt_ids, hf_greedy
):
    """The policy's `record` raising once used to send the round's rows into a retry that
    dropped their already-applied tokens from the stream (17 of 20 streamed, 20 in the result)."""
    engine = make_engine("draft", gamma=3).engine
    engine.policy = RecordFailsOnce()
    ids = [engine.add_request(GenerationRequest(p, 20, ignore_eos=True)) for p in prompt_ids[:2]]
    streamed = {seq_id: [] for seq_id in ids}
    while engine.has_unfinished():
        for output in engine.step():
            streamed[output.seq_id].extend(output.new_token_ids)
    results = [engine.result(seq_id) for seq_id in ids]
    assert engine.policy.records > 1
    for seq_id, prompt, result in zip(ids, prompt_ids, results):
        assert streamed[seq_id] == result.token_ids == hf_greedy(prompt, 20)


@pytest.mark.slow
def test_a_request_whose_grant_cannot_grow_fails_alone(short_context, prompt_ids, hf_greedy, monkeypatch):
    """The target's growth raises for one request only (say its slot state broke): that request
    ends with the error, its cache freed in both models; its neighbour decodes on, unchanged."""
    engine = short_context.engine
    grow = engine.verifier.grow

    def broken(reserves, taken):
        if any(seq_id == "broken" for seq_id, _ in reserves):
            raise RuntimeError("slot state lost")
        return grow(reserves, taken)

    monkeypatch.setattr(engine.verifier, "grow", broken)
    prompts = {"kept": prompt_ids[0][:8], "broken": prompt_ids[1][:8]}
    for seq_id, prompt in prompts.items():
        engine.add_request(GenerationRequest(prompt, 40, ignore_eos=True), seq_id=seq_id)
    last = {}
    while engine.has_unfinished():
        last.update((output.seq_id, output) for output in engine.step())
    assert engine.result("kept").token_ids == hf_greedy(prompts["kept"], 40)
    assert last["broken"].finish_reason == "error"
    with pytest.raises(RuntimeError, match="slot state lost"):
        engine.result("broken")
    assert engine.verifier.runner.cache.num_live == 0 and engine.proposer.proposers["draft"].runner.cache.num_live == 0
