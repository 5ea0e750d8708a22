"""The in-process verifier keeps the target's cache in step with the caller's history."""

import pytest
import torch

from specdec.models.kv_cache import CacheFullError
from specdec.models.model_paths import resolve_model_path
from specdec.models.model_runner import ModelRunner
from specdec.sampling.sampling_params import SamplingParams
from specdec.verifiers.target_verifier import TargetVerifier
from specdec.verifiers.verifier import VerifyRequest

GREEDY = SamplingParams()


@pytest.fixture(scope="module")
def runner():
    return ModelRunner.from_pretrained(resolve_model_path("bundled:target"), num_slots=4, max_seq_len=256)


def next_token(hf_target, history):
    with torch.no_grad():
        return int(hf_target(torch.tensor([history])).logits[0, -1].argmax())


def test_plain_round_emits_the_target_argmax(runner, hf_target, prompt_ids):
    verifier = TargetVerifier(runner)
    [r] = verifier.verify([VerifyRequest("a", prompt_ids[0], [], GREEDY)])
    assert (r.emitted, r.num_accepted) == ([next_token(hf_target, prompt_ids[0])], 0)
    verifier.release("a")


def test_drafting_the_target_continuation_is_fully_accepted_with_a_bonus(runner, hf_greedy, prompt_ids):
    verifier = TargetVerifier(runner)
    expected = hf_greedy(prompt_ids[1], 6)
    [r] = verifier.verify([VerifyRequest("a", prompt_ids[1], expected[:5], GREEDY)])
    assert (r.emitted, r.num_accepted) == (expected, 5)
    wrong = (expected[1] + 1) % runner.vocab_size
    [r] = verifier.verify([VerifyRequest("a", prompt_ids[1] + expected, [wrong], GREEDY)])
    assert r.num_accepted == 0 and len(r.emitted) == 1
    verifier.release("a")


def test_a_fresh_verifier_refills_from_the_history_alone(runner, hf_greedy, prompt_ids):
    history = prompt_ids[2] + hf_greedy(prompt_ids[2], 10)
    first = TargetVerifier(runner)
    [a] = first.verify([VerifyRequest("s", history, [], GREEDY)])
    first.release("s")
    restarted = TargetVerifier(runner)
    [b] = restarted.verify([VerifyRequest("s", history, [], GREEDY)])
    restarted.release("s")
    assert a.emitted == b.emitted == hf_greedy(prompt_ids[2], 11)[10:]


def test_a_cache_ahead_of_the_history_is_rolled_back(runner, hf_greedy, prompt_ids):
    """A lost reply: the caller repeats the round with its old history and gets the same answer."""
    verifier = TargetVerifier(runner)
    drafted = hf_greedy(prompt_ids[0], 4)[:3]
    [a] = verifier.verify([VerifyRequest("s", prompt_ids[0], drafted, GREEDY)])
    [b] = verifier.verify([VerifyRequest("s", prompt_ids[0], drafted, GREEDY)])
    assert a == b
    assert runner.slot_length(verifier._states["s"].slot) == len(prompt_ids[0]) + a.num_accepted
    verifier.release("s")


def test_release_frees_the_slot_and_ignores_unknown_ids(runner, prompt_ids):
    verifier = TargetVerifier(runner)
    free = verifier.num_free_slots
    verifier.verify([VerifyRequest("s", prompt_ids[0], [], GREEDY)])
    assert verifier.num_free_slots == free - 1
    verifier.release("s")
    verifier.release("never-seen")
    assert verifier.num_free_slots == free


def test_rows_without_draft_probabilities_are_verified_as_one_hot(runner):
    verifier = TargetVerifier(runner)
    v = runner.vocab_size
    requests = [
        VerifyRequest("p", [1, 2], [7, 8], SamplingParams(temperature=1.0), torch.full((2, v), 1.0 / v)),
        VerifyRequest("n", [1, 2], [9], SamplingParams(temperature=1.0)),
    ]
    ids, num_drafted, q = verifier._pack(requests, 2)
    assert ids.tolist() == [[7, 8], [9, -1]] and num_drafted.tolist() == [2, 1]
    assert q[1, 0, 9] == 1.0 and q[1, 0].sum() == 1.0 and q[1, 1].sum() == 0.0
    assert torch.allclose(q[0].sum(-1), torch.ones(2))


# ---- the target trusts nothing it is sent ------------------------------------------------

SAMPLED = SamplingParams(temperature=1.0, seed=3)


def _q(rows: int, vocab: int) -> torch.Tensor:
    return torch.full((rows, vocab), 1.0 / vocab)  # [rows, vocab], a valid q


def _bad_q(kind: str, vocab: int) -> torch.Tensor:
    q = _q(2, vocab)
    if kind == "nan":
        q[0, 5] = float("nan")
    elif kind == "inf":
        q[1, 0] = float("inf")
    elif kind == "negative":
        q[0, 1] = -0.5
    elif kind == "unnormalised":
        q *= 0.5
    elif kind == "zero at the drafted token":
        q[0, 7] = 0.0
        q[0] /= q[0].sum()
    elif kind == "wrong shape":
        q = _q(3, vocab)
    return q


@pytest.mark.parametrize(
    "kind", ["nan", "inf", "negative", "unnormalised", "zero at the drafted token", "wrong shape"]
)
def test_a_q_that_is_no_distribution_is_not_trusted_the_row_decodes_plainly(runner, prompt_ids, kind):
    verifier = TargetVerifier(runner)
    bad = VerifyRequest("bad", prompt_ids[0], [7, 9], SAMPLED, _bad_q(kind, runner.vocab_size))
    good = VerifyRequest("good", prompt_ids[1], [7, 9], SAMPLED, _q(2, runner.vocab_size))
    r_bad, r_good = verifier.verify([bad, good])
    assert (r_bad.num_accepted, len(r_bad.emitted)) == (0, 1), "verified as if nothing was drafted"
    assert verifier.rejected_proposals == 1
    assert r_good.num_accepted <= 2 and len(r_good.emitted) == r_good.num_accepted + 1
    for seq_id in ("bad", "good"):
        verifier.release(seq_id)


@pytest.mark.parametrize("drafted", [[4096], [-1], [3] * 300])
def test_drafted_ids_outside_the_vocabulary_or_the_context_are_not_verified(runner, prompt_ids, drafted):
    verifier = TargetVerifier(runner)
    [r] = verifier.verify([VerifyRequest("a", prompt_ids[0], drafted, GREEDY)])
    assert (r.num_accepted, verifier.rejected_proposals) == (0, 1)
    assert runner.slot_length(verifier._states["a"].slot) == len(prompt_ids[0])
    verifier.release("a")


def test_a_valid_q_is_verified(runner, prompt_ids):
    verifier = TargetVerifier(runner)
    [r] = verifier.verify([VerifyRequest("a", prompt_ids[0], [7, 9], SAMPLED, _q(2, runner.vocab_size).half().float())])
    assert verifier.rejected_proposals == 0 and len(r.emitted) == r.num_accepted + 1
    verifier.release("a")


# ---- q that arrives encoded (a remote draft's bytes) is decoded here, once ------------------


class Encoded:
    """An EncodedQ holding weights; counts its decodes; `broken` bytes do not decode."""

    def __init__(self, q: torch.Tensor, broken: bool = False) -> None:
        self.q, self.broken, self.decodes = q, broken, 0

    def __len__(self) -> int:
        return self.q.shape[0]

    def __getitem__(self, positions: slice) -> "Encoded":
        return Encoded(self.q[positions], self.broken)

    def decode(self, vocab_size: int) -> torch.Tensor:
        self.decodes += 1
        if self.broken:
            raise ValueError("dense distribution has 20 bytes")
        return self.q[:, :vocab_size]


def test_encoded_q_is_decoded_once_and_verified_like_the_same_weights(runner, prompt_ids):
    q = _q(2, runner.vocab_size).half().float()
    encoded, results = Encoded(q), []
    for probs in (q, encoded):
        verifier = TargetVerifier(runner)
        results.append(verifier.verify([VerifyRequest("a", prompt_ids[0], [7, 9], SAMPLED, probs)]))
        verifier.release("a")
    assert results[0] == results[1] and encoded.decodes == 1
    assert results[1][0].num_accepted <= 2 and verifier.rejected_proposals == 0


@pytest.mark.parametrize("kind", ["does not decode", "wrong count", "no distribution"])
def test_encoded_q_that_is_not_a_valid_q_is_not_trusted_the_row_decodes_plainly(runner, prompt_ids, kind):
    verifier = TargetVerifier(runner)
    encoded = {"does not decode": Encoded(_q(2, runner.vocab_size), broken=True),
               "wrong count": Encoded(_q(3, runner.vocab_size)),
               "no distribution": Encoded(_bad_q("unnormalised", runner.vocab_size))}[kind]
    [r] = verifier.verify([VerifyRequest("bad", prompt_ids[0], [7, 9], SAMPLED, encoded)])
    assert (r.num_accepted, len(r.emitted), verifier.rejected_proposals) == (0, 1, 1)
    verifier.release("bad")


def test_a_greedy_rows_encoded_q_is_not_decoded(runner, prompt_ids):
    verifier = TargetVerifier(runner)
    encoded = Encoded(_q(2, runner.vocab_size), broken=True)
    [r] = verifier.verify([VerifyRequest("g", prompt_ids[0], [7, 9], GREEDY, encoded)])
    assert encoded.decodes == 0 and verifier.rejected_proposals == 0 and len(r.emitted) == r.num_accepted + 1
    verifier.release("g")


def test_a_prompt_chunk_riding_the_verify_forward_reads_as_a_forward_of_its_own(runner, hf_greedy, hf_target,
                                                                              prompt_ids, monkeypatch):
    """A short catch-up (a prompt's next chunk) joins the decode rows' verify forward instead of
    a forward of its own: the same verdicts, and its slot holds exactly what it was sent."""
    verifier, forwards, forward = TargetVerifier(runner), [], runner.forward
    monkeypatch.setattr(runner, "forward", lambda *args, **kw: forwards.append(args[1]) or forward(*args, **kw))
    decoding, prompt = prompt_ids[0], prompt_ids[1]
    verifier.verify([VerifyRequest("d", decoding, [], GREEDY), VerifyRequest("p", prompt[:8], [], GREEDY)])
    drafted = hf_greedy(decoding, 5)[1:5]  # the decode row's verify forward is 5 wide
    history = decoding + hf_greedy(decoding, 1)
    forwards.clear()
    [d, p] = verifier.verify([VerifyRequest("d", history, drafted, GREEDY),
                              VerifyRequest("p", prompt[:13], [], GREEDY)])
    assert forwards == [[history[-1:] + drafted, prompt[8:13]]]  # one forward, 5 wide
    assert (d.emitted, d.num_accepted) == (hf_greedy(decoding, 6)[1:], 4)
    assert p.emitted == [next_token(hf_target, prompt[:13])]
    assert runner.slot_length(verifier._states["p"].slot) == 13
    [p] = verifier.verify([VerifyRequest("p", prompt[:13] + p.emitted, [], GREEDY)])  # the slot reads on
    assert p.emitted == hf_greedy(prompt[:13], 2)[1:]
    verifier.release("d")
    verifier.release("p")


def test_a_larger_grant_with_a_round_raises_the_reserve_and_one_the_cache_cannot_cover_fails_that_call(prompt_ids):
    """A remote router grows grants on its side and sends each with the sequence's next round:
    the target raises the reserve before it writes; a grant its blocks cannot cover is refused
    naming the row, before any forward (the engine's row isolation then fails that row alone)."""
    small = ModelRunner.from_pretrained(resolve_model_path("bundled:target"), num_slots=4, max_seq_len=64,
                                        block_size=8, num_blocks=8)
    verifier, history = TargetVerifier(small), prompt_ids[0][:8]
    verifier.verify([VerifyRequest("a", history, [], GREEDY, reserve_tokens=16)])
    slot = verifier._states["a"].slot
    assert small.cache.reserve_tokens(slot) == 16
    [r] = verifier.verify([VerifyRequest("a", history + [5], [], GREEDY, reserve_tokens=40)])
    assert small.cache.reserve_tokens(slot) == 40 and len(r.emitted) == 1
    verifier.verify([VerifyRequest("b", history, [], GREEDY, reserve_tokens=24)])  # 5 + 3 blocks: all 8 owed
    with pytest.raises(CacheFullError, match="sequence a: .* 48 tokens"):
        verifier.verify([VerifyRequest("a", history + [5, r.emitted[0]], [], GREEDY, reserve_tokens=48)])
    assert small.slot_length(slot) == len(history) + 1, "the refused call wrote nothing"
    for seq_id in "ab":
        verifier.release(seq_id)
