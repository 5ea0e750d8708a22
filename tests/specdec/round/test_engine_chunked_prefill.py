"""Chunked prefill may only change speed: output with prompts read in chunks equals output
with each prompt read whole, greedy and seeded sampled, with speculation on and off; a
prompt being read emits nothing while the rows already decoding go on emitting."""

from __future__ import annotations

import pytest

from specdec.requests.request import GenerationRequest
from specdec.sampling.sampling_params import SamplingParams

MAX_NEW = 24


@pytest.fixture(scope="module")
def long_prompts(prompt_ids) -> list[list[int]]:
    """Three prompts of 150, 61 and 30 tokens (bundled prompts joined)."""
    joined = [t for p in prompt_ids for t in p]
    return [joined[:150], joined[200:261], joined[400:430]]


@pytest.fixture(scope="module")
def whole(make_engine, long_prompts):
    """Greedy outputs with each prompt read whole, by proposer."""
    return {proposer: _generate(make_engine(proposer, gamma, scheduling={"prefill_chunk_tokens": 0}), long_prompts)
            for proposer, gamma in [("draft", 4), ("none", 0)]}


def _generate(built, prompts, sampling: SamplingParams | None = None) -> list[list[int]]:
    sampling = sampling or SamplingParams()
    requests = [GenerationRequest(p, MAX_NEW, sampling, ignore_eos=True) for p in prompts]
    return [r.token_ids for r in built.engine.generate(requests)]


class ReadRecorder:
    """Wraps the verifier: the prompt tokens each verify call makes the target read."""

    def __init__(self, inner, prompt_lengths: dict[str, int]):
        self.inner, self.prompt_lengths, self.seen, self.reads = inner, prompt_lengths, {}, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def verify_async(self, requests):
        reads = 0
        for r in requests:
            if len(r.token_ids) <= self.prompt_lengths[r.seq_id]:  # still in its prompt
                reads += len(r.token_ids) - self.seen.get(r.seq_id, 0)
            self.seen[r.seq_id] = len(r.token_ids)
        self.reads.append(reads)
        return self.inner.verify_async(requests)


@pytest.mark.parametrize("own", [{"mode": "off"}, {"gamma": 0}], ids=["mode off", "gamma 0"])
def test_the_draft_reads_no_chunk_of_a_row_that_never_drafts(make_engine, long_prompts, own):
    """A row in mode OFF, or with its own γ 0, never drafts: the draft is not asked to read its
    prompt's chunks (they would take a draft slot and a share of its forwards for nothing)."""
    built = make_engine("draft", 4, scheduling={"prefill_chunk_tokens": 32, "prefill_slowdown": 0})
    engine = built.engine
    short = engine.add_request(GenerationRequest(long_prompts[2], 64, ignore_eos=True))
    engine.step()
    plain = engine.add_request(GenerationRequest(long_prompts[0], 8, ignore_eos=True, **own))
    asked, propose = [], engine.proposer.propose
    engine.proposer.propose = lambda asks: asked.extend(ask.seq_id for ask in asks) or propose(asks)
    while plain not in {o.seq_id for o in engine.step() if o.new_token_ids}:
        pass
    assert plain not in asked and short in asked
    assert plain not in engine.proposer.proposers["draft"]._states


@pytest.mark.slow
@pytest.mark.parametrize("proposer, gamma", [("draft", 4), ("none", 0)])
@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_greedy_output_with_chunks_equals_output_with_whole_prompts(make_engine, long_prompts, whole, proposer, gamma,
                                                                   chunk):
    built = make_engine(proposer, gamma, scheduling={"prefill_chunk_tokens": chunk})
    prompts = long_prompts if chunk > 1 else long_prompts[1:]  # one token a round: the shorter ones
    assert _generate(built, prompts) == whole[proposer][-len(prompts):]
    assert built.engine.verifier.num_free_slots == 8  # every slot freed


@pytest.mark.slow
def test_seeded_sampled_output_with_chunks_equals_output_with_whole_prompts(make_engine, long_prompts):
    sampling = SamplingParams(temperature=0.8, top_p=0.95, seed=7)
    whole = _generate(make_engine("draft", 4, scheduling={"prefill_chunk_tokens": 0}), long_prompts, sampling)
    chunked = _generate(make_engine("draft", 4, scheduling={"prefill_chunk_tokens": 7}), long_prompts, sampling)
    assert chunked == whole


def test_a_row_decoding_keeps_emitting_while_a_long_prompt_is_read_within_the_budget(make_engine, long_prompts):
    built = make_engine("draft", 4, scheduling={"prefill_chunk_tokens": 32, "prefill_slowdown": 0})  # a fixed budget
    engine = built.engine
    short = engine.add_request(GenerationRequest(long_prompts[2], 64, ignore_eos=True))
    engine.step()  # the short prompt fits the budget: its first round emits
    long = engine.add_request(GenerationRequest(long_prompts[0], 8, ignore_eos=True))
    recorder = engine.verifier = ReadRecorder(engine.verifier, {short: 30, long: 150})
    draft = engine.proposer.proposers["draft"]
    calls, propose = [], engine.proposer.propose
    engine.proposer.propose = lambda asks: calls.append(len(asks)) or propose(asks)
    rounds_to_first_token = 0
    while True:
        calls.clear()
        outputs = {o.seq_id: o for o in engine.step()}
        assert calls == [2], "the draft reads the chunk in the round's one proposer call"
        rounds_to_first_token += 1
        if rounds_to_first_token == 1:  # the draft read the first chunk with the target
            assert draft.runner.slot_length(draft._states[long].slot) == 32
        assert outputs[short].new_token_ids  # the decoding row is never stalled
        if long in outputs:
            break
    assert rounds_to_first_token == 5  # 150 prompt tokens at 32 per round: 4 chunks, then its first round
    assert all(reads <= 32 for reads in recorder.reads)
    assert outputs[long].new_token_ids and engine.stats.accepted > 0


@pytest.mark.slow
def test_paced_chunks_beside_decoding_rows_leave_the_output_unchanged(make_engine, long_prompts, whole):
    """With the pace on, how much a round reads depends on measured times; the output must not."""
    built = make_engine("draft", 4, scheduling={"prefill_chunk_tokens": 64, "prefill_slowdown": 0.2})
    engine = built.engine
    ids = [engine.add_request(GenerationRequest(long_prompts[2], MAX_NEW, ignore_eos=True))]
    engine.step()  # the short prompt decodes: the 150-token one is paced (the 61-token one fits a chunk)
    ids += [engine.add_request(GenerationRequest(p, MAX_NEW, ignore_eos=True)) for p in long_prompts[:2]]
    while engine.has_unfinished():
        engine.step()
    outputs = {i: engine.result(i).token_ids for i in ids}
    assert [outputs[i] for i in ids] == [whole["draft"][2], whole["draft"][0], whole["draft"][1]]
