"""EmulatedModel: a stand-in for LlamaForServing that the ModelRunner drives unchanged.

It has no weights: its "KV cache" (the runner's paged KVCache, one layer, one head of width 1)
holds each slot's tokens, so slots, prefill, truncation (rollback), forks and ragged
batches are the runner's own code. A forward writes the new tokens, hashes each
position's n-gram context (`SyntheticLanguage`) and occupies its `EmulatedDevice` for the
time its `LatencyModel` gives for the batch's rows, tokens and attended context. Its logits
(the target's, or the draft's for what it makes of each context) are looked up within that
device time, as a GPU's lm_head runs within its forward: the "hidden state" it returns is
already the logits, and `compute_logits` is the identity.

Tensor parallelism: a rank keeps no shard of anything; each rank is a device of its own
that is busy for the group's forward time (the profile's time includes the collectives),
and the leader waits for every rank (MirroredRunner), as ranks wait at an all-reduce.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from specdec.models.emulated_device import EmulatedDevice
from specdec.models.emulated_language import SyntheticLanguage
from specdec.models.emulated_profile import DeviceModel, DeviceProfile, load_profile, parse_emulated_name
from specdec.models.emulated_tokenizer import readable_ids
from specdec.models.kv_cache import KVCache


@dataclass(frozen=True)
class EmulatedConfig:
    """The fields of LlamaFamilyConfig the runner and the tensor-parallel check read."""

    vocab_size: int
    max_position_embeddings: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    num_hidden_layers: int = 1  # cache layers: one, holding the tokens
    head_dim: int = 1
    model_type: str = "emulated"
    tie_word_embeddings: bool = False


class EmulatedModel:
    """Duck-types LlamaForServing for ModelRunner (forward_hidden / compute_logits)."""

    is_emulated = True
    dtype = torch.float32
    device = torch.device("cpu")
    num_local_kv_heads = 1

    def __init__(self, language: SyntheticLanguage, model: DeviceModel, role: str, device: EmulatedDevice) -> None:
        if role not in ("target", "draft"):
            raise ValueError(f"role={role!r} must be 'target' or 'draft'")
        self.language, self.latency, self.role, self.emulated_device = language, model.latency, role, device
        self.config = EmulatedConfig(language.vocab_size, model.max_position_embeddings, model.num_attention_heads,
                                     model.num_key_value_heads, model.intermediate_size)
        self.tp_rank, self.tp_world_size = 0, 1

    @property
    def vocab_size(self) -> int:
        return self.language.vocab_size

    def forward_hidden(self, input_ids: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                       slot_ids: torch.Tensor, num_tokens: torch.Tensor | None = None,
                       kv_len: int | None = None) -> torch.Tensor:
        """LlamaForServing.forward_hidden's contract; returns the logits [batch, seq, vocab]
        (the "hidden state" of a model whose lm_head is the identity: all the host work of a
        forward, logits included, runs within its device time, as a GPU's would)."""
        return self.emulated_device.run(
            lambda: self._seconds(input_ids, positions, slot_ids, num_tokens),
            lambda: self.language.rows(self._contexts(input_ids, positions, cache, slot_ids, num_tokens)))

    def _seconds(self, input_ids: torch.Tensor, positions: torch.Tensor, slot_ids: torch.Tensor,
                 num_tokens: torch.Tensor | None) -> float:
        """The forward's device time from the profile: rows, tokens and attended context."""
        tokens = input_ids.numel() if num_tokens is None else int(num_tokens.numpy().sum())  # None: no padding
        context = int(positions.numpy()[:, 0].sum()) + tokens
        return self.latency.forward_ms(len(slot_ids), tokens, context) / 1000.0

    def _contexts(self, input_ids: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                  slot_ids: torch.Tensor, num_tokens: torch.Tensor | None) -> np.ndarray:
        """[batch, seq] table rows of the positions' logits (the language's context buckets;
        the draft's rows also say what it makes of each context). The cache is read and written
        through its block table, as a paged-attention kernel addresses it, on numpy views of the
        runner's tensors (the same memory)."""
        ids, positions, slots = input_ids.numpy(), positions.numpy(), slot_ids.numpy()
        b, t = ids.shape
        write_slots = np.broadcast_to(slots[:, None], (b, t))  # [batch, seq]
        if num_tokens is not None:  # padding goes to the scratch slot, as in LlamaForServing
            counts = num_tokens.numpy()
            valid = np.arange(t) < counts[:, None]  # [batch, seq]
            positions = np.where(valid, positions, positions[np.arange(b), counts - 1][:, None])
            write_slots = np.where(valid, write_slots, cache.scratch_slot)
        pool_rows = cache.host_flat_index
        tokens = cache.keys[0].view(-1).numpy()  # [pool rows]: the slots' tokens (the "K/V" of a position)
        tokens[pool_rows(write_slots, positions)] = ids  # its "V" is never read: left as it is
        n = self.language.spec.context_tokens
        back = positions[..., None] - np.arange(n - 1, -1, -1)  # [batch, seq, n], oldest first
        history = tokens[pool_rows(slots[:, None, None], np.maximum(back, 0))].astype(np.int64)  # [batch, seq, n]
        history = np.where(back >= 0, history, self.vocab_size)  # before the text
        keys = self.language.context_keys(history)  # [batch, seq]
        buckets = self.language.buckets_of(keys)  # [batch, seq]
        if self.role == "target":
            return buckets
        length = self.language.spec.stretch_tokens
        starts = positions // length * length  # [batch, seq]: where each position's stretch begins
        anchors = tokens[pool_rows(slots[:, None], starts)].astype(np.int64)  # [batch, seq]
        kinds = self.language.draft_kinds(keys, anchors, positions // length)  # [batch, seq]
        return self.language.draft_rows(buckets, kinds)  # [batch, seq]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden (already the logits) [..., vocab] -> logits [..., vocab] (float32)."""
        return hidden


def load_emulated_model(name: str, time_scale: float = 1.0, profile: DeviceProfile | None = None) -> EmulatedModel:
    """The model 'emulated:<profile>:<role>' names, on a device of its own; its device times
    are the profile's times the profile's time_scale times `time_scale`."""
    parsed = parse_emulated_name(name)
    profile = profile if profile is not None else load_profile(parsed.profile)
    device = EmulatedDevice(f"{parsed.profile}:{parsed.role}", time_scale * profile.time_scale)
    language = SyntheticLanguage(profile.language, tokens=readable_ids(profile.language.vocab_size))
    return EmulatedModel(language, profile.model(parsed.role), parsed.role, device)
