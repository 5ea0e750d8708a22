"""greedy_verdicts: the verifier's list fast path gives rejection_sample's greedy verdicts."""

import torch

from specdec.sampling.rejection_sampler import greedy_verdicts, rejection_sample
from specdec.sampling.sampling import SamplingBatch
from specdec.sampling.sampling_params import SamplingParams


def test_greedy_verdicts_equal_the_batched_greedy_rule():
    generator = torch.Generator().manual_seed(7)
    batch, gamma, vocab = 64, 4, 12
    logits = torch.randn(batch, gamma + 1, vocab, generator=generator)  # [B, γ + 1, V]
    best = logits.argmax(dim=-1)  # [B, γ + 1]
    drafts = []
    for b in range(batch):  # ragged rows; each drafted token the target's argmax or not
        n = b % (gamma + 1)
        hits = torch.rand(n, generator=generator) < 0.7
        drafts.append([int(best[b, i]) if hits[i] else (int(best[b, i]) + 1) % vocab for i in range(n)])
    emitted, accepted = greedy_verdicts(logits, drafts)
    draft_ids = torch.tensor([row + [-1] * (gamma - len(row)) for row in drafts])  # [B, γ]
    sampling = SamplingBatch.from_params([SamplingParams()] * batch)
    out = rejection_sample(logits, draft_ids, torch.tensor([len(row) for row in drafts]), None, sampling)
    assert emitted == out.emitted() and accepted == out.num_accepted.tolist()
    assert 0 < sum(accepted) < sum(len(row) for row in drafts), "some drafts accepted, some rejected"


def test_a_batch_from_params_makes_the_same_tensors_when_first_read():
    params = [SamplingParams(), SamplingParams(temperature=0.7, top_k=5, top_p=0.9, seed=3, min_p=0.1)]
    batch = SamplingBatch.from_params(params, [10, 20])
    eager = SamplingBatch(temperature=torch.tensor([0.0, 0.7], dtype=torch.float64),
                          top_k=torch.tensor([0, 5]), top_p=torch.tensor([1.0, 0.9], dtype=torch.float64),
                          greedy=torch.tensor([True, False]), seeds=batch.seeds, positions=torch.tensor([10, 20]),
                          coupled=torch.tensor([False, True]), min_p=torch.tensor([0.0, 0.1], dtype=torch.float64))
    assert not batch.all_greedy and batch.batch_size == 2
    for name in ("temperature", "top_k", "top_p", "greedy", "positions", "coupled", "min_p"):
        assert torch.equal(getattr(batch, name), getattr(eager, name)), name
    assert batch.seeds.tolist() == [0, 3]
