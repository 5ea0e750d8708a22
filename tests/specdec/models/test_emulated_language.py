"""The emulated pair's language: deterministic logits, and the draft accepted at the profile's α.

Acceptance is measured as the engine would see it: the draft's q at each context (processed
with the request's sampling parameters), a drafted token drawn from it, and the real
rejection sampler deciding at γ = 1 whether the target accepts it.
"""

from __future__ import annotations

import pytest
import torch

from specdec.models.emulated_device import EmulatedDevice
from specdec.models.emulated_language import SyntheticLanguage
from specdec.models.emulated_model import EmulatedModel
from specdec.models.emulated_profile import LanguageSpec, load_profile
from specdec.models.model_runner import ModelRunner
from specdec.sampling.rejection_sampler import rejection_sample
from specdec.sampling.sampling import SamplingBatch, logits_to_probs, sample_from_probs
from specdec.sampling.sampling_params import SamplingParams

ROWS, LENGTH = 600, 32  # 19 200 contexts in 1 200 stretches


def runner(spec: LanguageSpec, role: str, rows: int = ROWS) -> ModelRunner:
    model = load_profile("h100-llama-8b-1b").model(role)
    emulated = EmulatedModel(SyntheticLanguage(spec), model, role, EmulatedDevice(role, time_scale=0.0))
    return ModelRunner(emulated, num_slots=rows, max_seq_len=LENGTH + 8)


def logits_over(spec: LanguageSpec, role: str, histories: list[list[int]]) -> torch.Tensor:
    """[rows, LENGTH, V]: the model's logits after each prefix of each history (one prefill)."""
    model = runner(spec, role, len(histories))
    slots = [model.allocate_slot() for _ in histories]
    return model.forward(slots, histories)


def random_histories(rows: int = ROWS, seed: int = 0, vocab: int = 512) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(1, vocab, (rows, LENGTH), generator=generator).tolist()


def measured_acceptance(spec: LanguageSpec, params: SamplingParams, histories: list[list[int]]) -> torch.Tensor:
    """[rows, LENGTH] bool: whether the target accepts the draft's token at each context."""
    p_logits = logits_over(spec, "target", histories).flatten(0, 1)  # [N, V]
    q_logits = logits_over(spec, "draft", histories).flatten(0, 1)  # [N, V]
    n = p_logits.shape[0]
    sampling = SamplingBatch.from_params([params] * n, list(range(n)))
    q = logits_to_probs(q_logits, sampling)  # [N, V]
    drafted = sample_from_probs(q, sampling)  # [N]
    target = torch.stack([p_logits, p_logits], dim=1)  # [N, 2, V]; the bonus position is not looked at
    out = rejection_sample(target, drafted[:, None], torch.ones(n, dtype=torch.long), q[:, None], sampling)
    return (out.num_accepted == 1).reshape(len(histories), LENGTH)


def test_logits_are_a_function_of_the_seed_and_the_context():
    spec = LanguageSpec(seed=7)
    histories = random_histories(rows=8)
    assert torch.equal(logits_over(spec, "target", histories), logits_over(spec, "target", histories))
    assert torch.equal(logits_over(spec, "draft", histories), logits_over(spec, "draft", histories))
    other = logits_over(LanguageSpec(seed=8), "target", histories)
    assert not torch.equal(logits_over(spec, "target", histories), other)


def test_a_context_is_its_last_n_tokens():
    spec = LanguageSpec(context_tokens=2)
    a, b = [5, 9, 11, 12] + [3] * (LENGTH - 4), [77, 9, 11, 12] + [3] * (LENGTH - 4)
    logits = logits_over(spec, "target", [a, b])  # [2, LENGTH, V]
    assert not torch.equal(logits[0, 1], logits[1, 1])  # (5, 9) vs (77, 9)
    assert torch.equal(logits[0, 2:], logits[1, 2:])  # the same last two tokens from position 2 on


def test_end_of_text_is_never_likely():
    probs = logits_over(LanguageSpec(), "target", random_histories(rows=50)).softmax(-1)
    assert float(probs[..., 0].max()) < 1e-12


@pytest.mark.parametrize(("alpha", "params"), [
    (0.3, SamplingParams(temperature=0.0)), (0.7, SamplingParams(temperature=0.0)),
    (0.9, SamplingParams(temperature=0.0)), (0.3, SamplingParams(temperature=1.0, seed=3)),
    (0.9, SamplingParams(temperature=1.0, seed=3)), (0.7, SamplingParams(temperature=0.7, top_p=0.9, seed=4)),
], ids=["greedy-0.3", "greedy-0.7", "greedy-0.9", "t1-0.3", "t1-0.9", "t0.7-top_p-0.7"])
def test_the_draft_is_accepted_at_the_profiles_rate(alpha, params):
    accepted = measured_acceptance(LanguageSpec(acceptance=alpha), params, random_histories())
    assert abs(float(accepted.float().mean()) - alpha) <= 0.03


def test_acceptance_varies_from_stretch_to_stretch():
    spec = LanguageSpec(acceptance=0.6, acceptance_spread=1.0, stretch_tokens=16)
    accepted = measured_acceptance(spec, SamplingParams(), random_histories()).float()
    per_stretch = accepted.reshape(ROWS, LENGTH // 16, 16).mean(-1).flatten()  # [stretches]
    easy, hard = per_stretch[per_stretch >= 0.6], per_stretch[per_stretch < 0.6]
    assert 0.3 < len(easy) / len(per_stretch) < 0.7  # half the stretches easy, half hard
    assert float(easy.mean()) > 0.85 and float(hard.mean()) < 0.35  # α ± 0.4 (spread 1)


def test_where_the_draft_misses_it_still_ranks_the_targets_token_high():
    spec = LanguageSpec(acceptance=0.5, miss_ranks=(0.42, 0.16, 0.09))
    histories = random_histories(rows=200)
    p_logits = logits_over(spec, "target", histories).flatten(0, 1)  # [N, V]
    q_logits = logits_over(spec, "draft", histories).flatten(0, 1)  # [N, V]
    wanted = p_logits.argmax(dim=-1)  # [N]
    missed = q_logits.argmax(dim=-1) != wanted  # [N]
    above = (q_logits > q_logits.gather(1, wanted[:, None])).sum(dim=-1)[missed]  # draft tokens ranked above it
    assert 0.4 < float(missed.float().mean()) < 0.6
    for rank, share in ((2, 0.42), (3, 0.16), (4, 0.09)):
        assert abs(float((above == rank - 1).float().mean()) - share) <= 0.03, rank
    assert float((above > 3).float().mean()) > 0.25  # the rest: ranked nowhere near the top


def test_the_overlap_of_misses_is_split_between_greedy_and_sampled_acceptance():
    """Sampled drafts are accepted on misses too (the ranked target token carries some of q):
    the draft knows contexts at the rate that puts α halfway between greedy and sampled."""
    spec = LanguageSpec(acceptance=0.3, acceptance_spread=0.0)
    language = SyntheticLanguage(spec)
    histories = random_histories()
    greedy = float(measured_acceptance(spec, SamplingParams(), histories).float().mean())
    sampled = float(measured_acceptance(spec, SamplingParams(temperature=1.0, seed=5), histories).float().mean())
    known = language.known_share(0.3)
    assert 0.02 < language.miss_overlap < 0.15
    assert abs(greedy - known) <= 0.01  # a missed context accepts nothing greedily
    assert abs(sampled - greedy - (1 - known) * language.miss_overlap) <= 0.015
    assert abs((greedy + sampled) / 2 - 0.3) <= 0.01


def test_without_ranked_misses_greedy_and_sampled_acceptance_agree():
    spec = LanguageSpec(acceptance=0.7, miss_ranks=())
    assert SyntheticLanguage(spec).miss_overlap == 0.0
    histories = random_histories(rows=200)
    greedy = measured_acceptance(spec, SamplingParams(), histories)
    sampled = measured_acceptance(spec, SamplingParams(temperature=1.0, seed=3), histories)
    assert torch.equal(greedy, sampled)  # a context is known (accepted) or guessed elsewhere (rejected)
