"""Prefix caching in the paged KVCache: full blocks indexed by their tokens and every token before
them, attached to later sequences that start the same way, kept while unreferenced until evicted
(least recently released first), never rewritten in place while indexed."""

from __future__ import annotations

import random

import torch

from specdec.models.kv_cache import KVCache


def _cache(num_slots: int = 4, num_blocks: int | None = None, max_seq_len: int = 16) -> KVCache:
    return KVCache(num_layers=1, num_slots=num_slots, max_seq_len=max_seq_len, num_kv_heads=1, head_dim=2,
                   block_size=4, num_blocks=num_blocks)


def _kv_of(tokens: list[int], start: int) -> torch.Tensor:
    """Stand-in K/V of tokens at positions start…: a function of token and position only, as real K/V
    are a function of the prefix."""
    return torch.tensor([[[float(t), float(start + i)]] for i, t in enumerate(tokens)])  # [n, 1, 2]


def _forward(cache: KVCache, slot: int, tokens: list[int]) -> int:
    """What ModelRunner.forward(last_only=True) does: attach cached blocks, write the rest; returns hits."""
    attached = cache.attach_prefix(slot, tokens)
    rest, start = tokens[attached:], cache.length(slot)
    cache.prepare(slot, len(rest))
    keys = _kv_of(rest, start)
    cache.write(0, cache.flat_index(torch.tensor(slot), torch.arange(start, start + len(rest))), keys, keys)
    cache.advance(slot, len(rest), rest)
    return attached


def _read(cache: KVCache, slot: int) -> torch.Tensor:
    return cache.gather(0, cache.read_index(torch.tensor([slot]), cache.length(slot)))[0][0]


def test_a_sequence_starting_like_an_earlier_one_reuses_its_full_blocks():
    cache = _cache()
    first = cache.allocate()
    system = list(range(10, 19))  # 9 tokens: two full blocks and one more
    assert _forward(cache, first, system + [1, 2]) == 0
    second = cache.allocate()
    assert _forward(cache, second, system + [3]) == 8, "the two full blocks, not the partial third"
    assert cache.blocks(second)[:2] == cache.blocks(first)[:2] and cache.cached_tokens(second) == 8
    assert torch.equal(_read(cache, second), _kv_of(system + [3], 0))
    assert torch.equal(_read(cache, first), _kv_of(system + [1, 2], 0)), "the first is untouched"


def test_at_least_one_token_is_left_to_compute_and_a_different_prefix_misses():
    cache = _cache()
    _forward(cache, cache.allocate(), list(range(8)))
    again = cache.allocate()
    assert _forward(cache, again, list(range(8))) == 4, "the last token's logits need a forward"
    other = cache.allocate()
    assert _forward(cache, other, [99] + list(range(1, 8))) == 0, "block keys cover the whole prefix"


def test_unreferenced_cached_blocks_serve_later_requests_until_evicted_least_recent_first():
    cache = _cache(num_slots=2, num_blocks=4)
    old, new = cache.allocate(reserve_tokens=8), cache.allocate(reserve_tokens=8)
    _forward(cache, old, [1] * 5)
    _forward(cache, new, [2] * 5)
    cache.free(old)
    cache.free(new)
    assert cache.pool.num_evictable == 2 and cache.pool.num_free == 4, "cached blocks still count as free"
    hit = cache.allocate(reserve_tokens=8)
    assert _forward(cache, hit, [2] * 4 + [7]) == 4, "a freed sequence's blocks are still readable"
    filler = cache.allocate(reserve_tokens=8)
    _forward(cache, filler, [3] * 5)  # 2 blocks: the last never-used one, then the oldest evictable one
    assert len(cache.prefix) == 2 and cache.pool.num_evictable == 0, "[1]*4 evicted; [2]*4 and [3]*4 kept"
    cache.free(filler)
    probe = cache.allocate(reserve_tokens=8)
    assert _forward(cache, probe, [1] * 5) == 0, "the evicted prefix is computed again"
    assert torch.equal(_read(cache, probe), _kv_of([1] * 5, 0))


def test_a_cached_block_rewritten_in_place_is_forgotten_first():
    cache = _cache()
    slot = cache.allocate()
    _forward(cache, slot, [5] * 8)
    cache.truncate(slot, 6)  # the second block is partly rolled back and will be rewritten
    _forward(cache, slot, [6, 6])
    probe = cache.allocate()
    assert _forward(cache, probe, [5] * 8 + [0]) == 4, "only the unchanged first block still matches"
    assert torch.equal(_read(cache, probe), _kv_of([5] * 8 + [0], 0))


def test_random_sharing_never_writes_into_a_shared_or_indexed_block_and_every_read_is_exact():
    rng = random.Random(1)
    cache = _cache(num_slots=5, num_blocks=14)
    write = cache.write

    def checked_write(layer, index, keys, values):
        for block in (index // cache.block_size).flatten().tolist():
            assert cache.pool.refcount(block) == 1 and not cache.pool.is_cached(block), f"write into block {block}"
        write(layer, index, keys, values)

    cache.write = checked_write
    prefixes = [[1] * 8, [1] * 4 + [2] * 4, [3] * 6]
    live: dict[int, list[int]] = {}
    hits = 0
    for _ in range(400):
        action = rng.random()
        if action < 0.3 and cache.num_free:
            slot = cache.allocate()
            tokens = rng.choice(prefixes) + [rng.randrange(9) for _ in range(rng.randint(1, 4))]
            hits += _forward(cache, slot, tokens)
            live[slot] = tokens
        elif action < 0.5 and live:
            slot = rng.choice(list(live))
            cache.free(slot)
            del live[slot]
        elif live:
            slot = rng.choice(list(live))
            cut = rng.randint(0, len(live[slot]))
            cache.truncate(slot, cut)
            extra = [rng.randrange(9) for _ in range(rng.randint(1, 16 - cut))] if cut < 16 else []
            if extra:
                _forward(cache, slot, extra)
            live[slot] = live[slot][:cut] + extra
        for slot, tokens in live.items():
            assert torch.equal(_read(cache, slot), _kv_of(tokens, 0)) if tokens else cache.length(slot) == 0
    assert hits > 0, "the workload exercised prefix hits"


def test_a_prefix_hit_gives_the_logits_and_greedy_tokens_of_a_miss(tiny_checkpoint):
    from specdec.models import ModelRunner

    path = str(tiny_checkpoint("llama"))
    system = list(range(3, 20))  # 17 tokens: four full blocks of 4

    def greedy(runner: ModelRunner) -> tuple[list[torch.Tensor], int]:
        slot = runner.allocate_slot()
        logits = [runner.forward([slot], [system + [50, 51]], last_only=True)[0]]
        for _ in range(6):
            logits.append(runner.forward([slot], [[int(logits[-1].argmax())]], last_only=True)[0])
        return logits, runner.cached_tokens(slot)

    hit = ModelRunner.from_pretrained(path, num_slots=2, max_seq_len=64, block_size=4)
    warm = hit.allocate_slot()
    hit.forward([warm], [system + [40]], last_only=True)  # another request with the same system prompt
    hit.free_slot(warm)
    miss = ModelRunner.from_pretrained(path, num_slots=2, max_seq_len=64, block_size=4, prefix_caching=False)
    (hit_logits, hit_cached), (miss_logits, miss_cached) = greedy(hit), greedy(miss)
    assert (hit_cached, miss_cached) == (16, 0)
    assert [int(x.argmax()) for x in hit_logits] == [int(x.argmax()) for x in miss_logits]
    for a, b in zip(hit_logits, miss_logits):
        assert torch.allclose(a, b, atol=1e-5)
