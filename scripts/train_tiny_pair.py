"""Train the bundled tiny model pair (a one-off; CI never runs this).

It builds, from the Python standard library source found on this machine:
  * a byte-level BPE tokenizer (4,096 tokens, shared by both models);
  * a *target*: a 6-layer, 256-wide Llama (about 6.5 M parameters);
  * a *draft*: a 2-layer, 128-wide Llama (about 1.4 M parameters), distilled from the
    target's logits (KL to the target plus a little next-token cross-entropy), which is
    the biggest lever on acceptance.
Both are saved in fp16 safetensors in Hugging Face layout, loadable by
`transformers.AutoModelForCausalLM` and by `specdec.models`. A model card with the
measured figures and a file of held-out prompts (used by tests and benchmarks) are
written beside them.

Usage:  python scripts/train_tiny_pair.py [--out specdec/bundled] [--target-steps 600]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sysconfig
import time
import zlib
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

EOS = "<|endoftext|>"
SEQ_LEN = 256
VOCAB_SIZE = 4096
SKIP_PARTS = {"site-packages", "test", "tests", "idle_test", "__pycache__"}


def source_files() -> tuple[list[Path], list[Path]]:
    """Standard-library .py files, split deterministically into train / held-out (~3%)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if not SKIP_PARTS & set(p.relative_to(root).parts))
    heldout = [p for p in files if zlib.crc32(str(p.relative_to(root)).encode()) % 33 == 0]
    train = [p for p in files if p not in set(heldout)]
    return train, heldout


def read_texts(paths: list[Path]) -> list[str]:
    texts = []
    for p in paths:
        try:
            texts.append(p.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, OSError):
            continue
    return texts


def train_tokenizer(texts: list[str]) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS)


def encode_stream(tokenizer: PreTrainedTokenizerFast, texts: list[str]) -> torch.Tensor:
    ids: list[int] = []
    for ids_one in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        ids.extend(ids_one)
        ids.append(tokenizer.eos_token_id)
    return torch.tensor(ids, dtype=torch.long)


def model_config(layers: int, hidden: int, heads: int, kv_heads: int, eos_id: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=hidden,
        intermediate_size=int(hidden * 8 / 3 + 15) // 16 * 16,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=2048,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
    )


def batches(stream: torch.Tensor, batch_size: int, rng: random.Random):
    """Endless random windows of SEQ_LEN + 1 tokens."""
    n = stream.numel() - SEQ_LEN - 1
    while True:
        starts = [rng.randrange(n) for _ in range(batch_size)]
        yield torch.stack([stream[s : s + SEQ_LEN + 1] for s in starts])


def lr_at(step: int, steps: int, peak: float, warmup: int = 30) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


@torch.no_grad()
def heldout_loss(model: LlamaForCausalLM, stream: torch.Tensor, windows: int = 64) -> float:
    model.eval()
    losses = []
    for i in range(windows):
        s = i * (stream.numel() - SEQ_LEN - 1) // windows
        x = stream[s : s + SEQ_LEN + 1].unsqueeze(0)
        logits = model(x[:, :-1]).logits
        losses.append(F.cross_entropy(logits[0], x[0, 1:]).item())
    model.train()
    return sum(losses) / len(losses)


def train(model, stream, steps, batch_size, peak_lr, loss_fn, label) -> float:
    opt = torch.optim.AdamW(model.parameters(), lr=peak_lr, weight_decay=0.1, betas=(0.9, 0.95))
    rng = random.Random(0)
    data = batches(stream, batch_size, rng)
    start = time.time()
    model.train()
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, peak_lr)
        x = next(data)
        loss = loss_fn(model, x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 25 == 0 or step == steps - 1:
            rate = (step + 1) * batch_size * SEQ_LEN / (time.time() - start)
            print(f"[{label}] step {step}/{steps} loss {loss.item():.3f} ({rate:.0f} tok/s)", flush=True)
    return time.time() - start


def lm_loss(model, x):
    logits = model(x[:, :-1]).logits
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1))


def distill_loss(teacher, alpha_ce: float = 0.1):
    def fn(model, x):
        with torch.no_grad():
            t_logp = F.log_softmax(teacher(x[:, :-1]).logits.float(), dim=-1)
        logits = model(x[:, :-1]).logits
        logp = F.log_softmax(logits, dim=-1)
        kl = F.kl_div(logp.reshape(-1, logp.size(-1)), t_logp.reshape(-1, t_logp.size(-1)),
                      log_target=True, reduction="batchmean")
        ce = F.cross_entropy(logits.reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1))
        return (1 - alpha_ce) * kl + alpha_ce * ce
    return fn


@torch.no_grad()
def greedy_agreement(target, draft, stream: torch.Tensor, windows: int = 32) -> float:
    """Teacher-forced top-1 agreement of draft and target on held-out text (a proxy for α)."""
    agree = total = 0
    for i in range(windows):
        s = i * (stream.numel() - SEQ_LEN - 1) // windows
        x = stream[s : s + SEQ_LEN].unsqueeze(0)
        a = target(x).logits.argmax(-1)
        b = draft(x).logits.argmax(-1)
        agree += (a == b).sum().item()
        total += a.numel()
    return agree / total


def heldout_prompts(texts: list[str], tokenizer, count: int = 16, prompt_tokens: int = 64) -> list[str]:
    """Prompts cut from held-out files: the 64 tokens that start at a `def` line."""
    prompts = []
    for text in texts:
        pos = text.find("\ndef ", len(text) // 3)
        if pos < 0:
            continue
        ids = tokenizer(text[pos + 1 :], add_special_tokens=False)["input_ids"][:prompt_tokens]
        if len(ids) == prompt_tokens:
            prompts.append(tokenizer.decode(ids))
        if len(prompts) == count:
            break
    return prompts


def save(model, tokenizer, out: Path) -> int:
    model = model.half()
    model.config.dtype = "float16"
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    model.generation_config.save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "specdec" / "bundled")
    ap.add_argument("--target-steps", type=int, default=600)
    ap.add_argument("--draft-steps", type=int, default=500)
    ap.add_argument("--batch-size", type=int, default=16)
    args = ap.parse_args()
    torch.manual_seed(0)
    t0 = time.time()

    train_files, heldout_files = source_files()
    train_texts, heldout_texts = read_texts(train_files), read_texts(heldout_files)
    tokenizer = train_tokenizer(train_texts)
    train_stream = encode_stream(tokenizer, train_texts)
    heldout_stream = encode_stream(tokenizer, heldout_texts)
    print(f"tokenizer + data: {train_stream.numel()} train / {heldout_stream.numel()} held-out tokens "
          f"({time.time() - t0:.0f}s)", flush=True)

    eos = tokenizer.eos_token_id
    target = LlamaForCausalLM(model_config(6, 256, 8, 4, eos))
    target_secs = train(target, train_stream, args.target_steps, args.batch_size, 1.5e-3, lm_loss, "target")
    target.eval()
    for p in target.parameters():
        p.requires_grad_(False)

    draft = LlamaForCausalLM(model_config(2, 128, 4, 2, eos))
    draft_secs = train(draft, train_stream, args.draft_steps, args.batch_size, 3e-3, distill_loss(target), "draft")
    draft.eval()

    card = {
        "data": f"Python {sysconfig.get_python_version()} standard library source, tests excluded",
        "train_tokens": train_stream.numel(),
        "heldout_tokens": heldout_stream.numel(),
        "tokenizer": f"byte-level BPE, {VOCAB_SIZE} tokens, eos {EOS!r}",
        "seq_len": SEQ_LEN,
        "target": {"steps": args.target_steps, "batch": args.batch_size, "train_seconds": round(target_secs),
                   "heldout_loss": round(heldout_loss(target, heldout_stream), 3)},
        "draft": {"steps": args.draft_steps, "batch": args.batch_size, "train_seconds": round(draft_secs),
                  "heldout_loss": round(heldout_loss(draft, heldout_stream), 3),
                  "teacher_forced_top1_agreement": round(greedy_agreement(target, draft, heldout_stream), 3)},
    }
    card["target"]["params"] = save(target, tokenizer, args.out / "target")
    card["draft"]["params"] = save(draft, tokenizer, args.out / "draft")
    (args.out / "training.json").write_text(json.dumps(card, indent=2) + "\n")
    (args.out / "prompts.json").write_text(json.dumps(heldout_prompts(heldout_texts, tokenizer), indent=2) + "\n")
    print(json.dumps(card, indent=2))
    print(f"total {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
