#!/usr/bin/env python3
"""Train a small GPT on token files in nanoGPT's layout, fed by pinring's Rust loaders.

    pip install pinring-*.whl torch   # the wheel: README.md, "Install"
    python examples/train_gpt_tokens.py --data data/openwebtext --loaders 4

``--data DIR`` holds nanoGPT's ``train.bin`` (and ``val.bin``): the token ids as flat
little-endian ``uint16``, no header, as nanoGPT's ``prepare.py`` scripts write them.
``pinring.Loader`` reads ``train.bin`` as a ``kind = "tokens"`` dataset: sample ``k`` is the
window of ``block_size + 1`` tokens at ``k * block_size``, split into ``input_ids`` and
``targets`` (the same window shifted by one), shuffled per epoch by pinring's plan. It runs the
daemon inside this process (the ring pinned and registered with CUDA once) and starts
``--loaders`` ``pinring-loader`` processes, which read the windows into the ring's slots; the
batches arrive on the GPU, ``i64``, already there when the step asks.

The loop saves ``{"model", "optimizer", "loader", "step"}`` to ``--checkpoint`` every
``--save-every`` steps and at the end; ``--resume`` starts from it, the loader at the batch after
the last one trained on (``Loader.load_state_dict``), so no window is seen twice or skipped.

At the end it prints tokens/s, the share of the loop's time spent waiting for a batch, and on a
GPU how long the GPU sat idle between steps (CUDA events: from one step's last kernel to the
next step's first, over every step after ``--warmup``).

Usage: train_gpt_tokens.py --data DIR [--loaders 4] [--batch-size 16] [--block-size 1024]
           [--layers 12] [--heads 12] [--embd 768] [--steps 0] [--epochs 1] [--lr 6e-4]
           [--device cuda] [--checkpoint ckpt.pt] [--save-every 0] [--resume]
"""

from __future__ import annotations

import argparse
import math
import os
import pickle
import time
from typing import Any, Dict, List, Optional, Tuple


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="directory with nanoGPT's train.bin")
    p.add_argument("--loaders", type=int, default=4, help="pinring-loader processes")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--block-size", type=int, default=1024)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--embd", type=int, default=768)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: epochs)")
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--warmup", type=int, default=10, help="steps not counted in the figures")
    p.add_argument("--device", default=None,
                   help="cuda, cuda:N or cpu (default: cuda where torch sees a GPU, else cpu)")
    p.add_argument("--checkpoint", default=None, help="where to save (and --resume from)")
    p.add_argument("--save-every", type=int, default=0, help="save every N steps (0: at the end)")
    p.add_argument("--resume", action="store_true", help="start from --checkpoint")
    return p.parse_args()


# The arguments are read before torch is imported: --help and a wrong argument answer at once,
# not after the seconds that importing torch takes.
if __name__ == "__main__":
    ARGS = parse()

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import pinring  # noqa: E402


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then an MLP."""

    def __init__(self, embd: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(embd)
        self.qkv = nn.Linear(embd, 3 * embd)
        self.proj = nn.Linear(embd, embd)
        self.ln2 = nn.LayerNorm(embd)
        self.mlp = nn.Sequential(nn.Linear(embd, 4 * embd), nn.GELU(), nn.Linear(4 * embd, embd))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, c))
        out: torch.Tensor = x + self.mlp(self.ln2(x))
        return out


class GPT(nn.Module):
    """nanoGPT's model, in short: token and position embeddings, blocks, a tied head."""

    def __init__(self, vocab: int, block_size: int, layers: int, heads: int, embd: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, embd)
        self.pos = nn.Embedding(block_size, embd)
        self.blocks = nn.ModuleList(Block(embd, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(embd)
        self.head = nn.Linear(embd, vocab, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), targets.reshape(-1))


def vocab_size(data: str) -> int:
    """nanoGPT's ``meta.pkl`` vocabulary size when there is one, else GPT-2's, padded to 64."""
    meta = os.path.join(data, "meta.pkl")
    if os.path.exists(meta):
        with open(meta, "rb") as f:
            return int(pickle.load(f)["vocab_size"])
    return 50304


def lr_at(step: int, args: argparse.Namespace, total: int) -> float:
    """Linear warm-up, then cosine decay to a tenth (nanoGPT's schedule)."""
    warm = max(1, min(100, total // 10))
    if step < warm:
        return float(args.lr * (step + 1) / warm)
    t = (step - warm) / max(1, total - warm)
    return float(args.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, t)))))


def main(args: argparse.Namespace) -> None:
    dev = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = dev.type == "cuda"
    torch.manual_seed(0)
    model = GPT(vocab_size(args.data), args.block_size, args.layers, args.heads, args.embd).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)

    loader = pinring.Loader(
        dataset={
            "kind": "tokens",
            "files": [os.path.join(args.data, "train.bin")],
            "token_dtype": "u16",
            "seq_len": args.block_size,
        },
        batch_size=args.batch_size,
        shuffle=True,
        drop_last=True,
        # --steps runs that many steps, over as many epochs as they take (a plan without
        # end); otherwise the plan covers --epochs, and the loop stops at its last batch.
        epochs=None if args.steps else args.epochs,
        loaders=args.loaders,
        device=dev,  # a torch.device: "cuda" or "cuda:N" (the CUDA backend) or "cpu" (the host's)
    )
    step = 0
    if args.resume:
        saved: Dict[str, Any] = torch.load(args.checkpoint, map_location=dev)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        loader.load_state_dict(saved["loader"])
        step = int(saved["step"])
        print(f"resumed at step {step}, seq {saved['loader']['seq']}", flush=True)
    total = args.steps or len(loader) * args.epochs

    def save() -> None:
        if args.checkpoint:
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                        "loader": loader.state_dict(), "step": step}, args.checkpoint)

    # The figures: host time waiting for batches, and on a GPU each step's first and last
    # event, read once at the end (no synchronisation inside the loop).
    events: List[Tuple[torch.cuda.Event, torch.cuda.Event]] = []
    waited = 0.0
    t0: Optional[float] = None
    loss = torch.zeros((), device=dev)
    with loader:
        it = iter(loader)
        while step < total:
            t = time.perf_counter()
            batch = next(it, None)
            if batch is None:  # an epoch's end: the next `for` is the next epoch
                it = iter(loader)
                batch = next(it)
            if step == args.warmup:
                if cuda:
                    torch.cuda.synchronize(dev)
                t0, waited, events = time.perf_counter(), 0.0, []
            else:
                waited += time.perf_counter() - t
            x, y = batch["input_ids"], batch["targets"]
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            for group in opt.param_groups:
                group["lr"] = lr_at(step, args, total)
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                loss = model(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if cuda:
                end.record()
                events.append((start, end))
            step += 1
            if args.save_every and step % args.save_every == 0:
                save()
        save()
        summary = loader.close()
    if cuda:
        torch.cuda.synchronize(dev)
    print(f"step {step}: loss {loss.item():.3f}")
    if t0 is None:
        return
    wall = time.perf_counter() - t0
    measured = step - args.warmup
    tokens = measured * args.batch_size * args.block_size
    print(f"{measured} steps in {wall:.2f} s: {tokens / wall:,.0f} tokens/s, "
          f"{wall / measured * 1e3:.1f} ms/step, waiting for batches {waited / wall:.1%}")
    if cuda and len(events) > 1:
        idle = sum(max(0.0, a[1].elapsed_time(b[0])) for a, b in zip(events, events[1:]))
        span = events[0][0].elapsed_time(events[-1][1])
        print(f"GPU idle between steps: {idle / span:.2%} of {span / 1e3:.2f} s")
    if summary:
        print(f"pinring: {summary.get('batches_delivered')} batches delivered, verdict "
              f"{summary.get('bound')}")


if __name__ == "__main__":
    main(ARGS)
