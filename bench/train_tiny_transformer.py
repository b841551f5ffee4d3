#!/usr/bin/env python3
"""Trains one tiny causal transformer several times from the same seed on the same batches, changing only its
attention: PyTorch SDPA's FlashAttention-2 backend (the reference), flashgen.torch.attention, and SDPA's
memory-efficient and cuDNN backends (other correct bf16 attentions: how far their curves drift from the
reference measures bf16 noise). flashgen's loss curve must stay as close to the reference as that noise (within
3x the larger drift, plus 0.02 nats), and the model must learn. Writes the curves as CSV and PNG (device, date,
versions) and exits 1 otherwise.

Run on a GPU machine:  python3 bench/train_tiny_transformer.py [--steps 400] [--out-dir bench/results]

The task needs attention: each sequence is a 32-token phrase from a random sparse Markov chain (4 successors
per token, so the first phrase can be predicted only to ln 4 nats) repeated to fill the context, so later
repeats can be copied exactly by attending 32 tokens back. 4 layers, d_model 256, 4 query heads sharing 2
key/value heads (grouped-query attention), head_dim 64, bf16 autocast, AdamW.
"""

import argparse
import csv
import datetime
import math
import os
import re
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO_ROOT, "python"))

VOCAB = 64
PHRASE = 32          # tokens in the repeated phrase
SUCCESSORS = 4       # Markov chain: each token is followed by one of 4 fixed tokens
NOISE_FACTOR = 3.0   # flashgen may drift this many times as far from the reference as the other SDPA backends ...
NOISE_FLOOR = 0.02   # ... plus this many nats
REFERENCE = "sdpa_flash"
NOISE_GAUGES = ("sdpa_efficient", "sdpa_cudnn")
LABELS = {"sdpa_flash": "SDPA FlashAttention-2 (reference)", "flashgen": "flashgen",
          "sdpa_efficient": "SDPA memory-efficient", "sdpa_cudnn": "SDPA cuDNN"}


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=400, help="optimizer steps per run (default: %(default)s)")
    parser.add_argument("--batch", type=int, default=16, help="sequences per batch (default: %(default)s)")
    parser.add_argument("--seqlen", type=int, default=256, help="tokens per sequence (default: %(default)s)")
    parser.add_argument("--lr", type=float, default=2e-3, help="peak learning rate (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and the data (default: %(default)s)")
    parser.add_argument("--out-dir", default=os.path.join(REPO_ROOT, "bench", "results"),
                        help="folder of the CSV and PNG (default: bench/results)")
    parser.add_argument("--lib", default=None, help="libflashgen.so to load (sets FLASHGEN_LIBRARY)")
    return parser.parse_args()


def build_model(torch, attention):
    """A 4-layer pre-norm causal transformer whose attention(q, k, v) takes and returns [batch, seq, heads, 64]."""
    nn = torch.nn
    d_model, heads, kv_heads, head_dim, layers = 256, 4, 2, 64, 4

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention_norm = nn.LayerNorm(d_model)
            self.query = nn.Linear(d_model, heads * head_dim, bias=False)
            self.key_value = nn.Linear(d_model, 2 * kv_heads * head_dim, bias=False)
            self.projection = nn.Linear(heads * head_dim, d_model, bias=False)
            self.mlp_norm = nn.LayerNorm(d_model)
            self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

        def forward(self, x):
            batch, seqlen, _ = x.shape
            h = self.attention_norm(x)
            q = self.query(h).view(batch, seqlen, heads, head_dim)
            k, v = self.key_value(h).view(batch, seqlen, 2, kv_heads, head_dim).unbind(2)  # strided views
            x = x + self.projection(attention(q, k, v).reshape(batch, seqlen, heads * head_dim))
            return x + self.mlp(self.mlp_norm(x))

    class Model(nn.Module):
        def __init__(self, max_seqlen):
            super().__init__()
            self.tokens = nn.Embedding(VOCAB, d_model)
            self.positions = nn.Embedding(max_seqlen, d_model)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.norm = nn.LayerNorm(d_model)
            self.head = nn.Linear(d_model, VOCAB, bias=False)

        def forward(self, tokens):
            x = self.tokens(tokens) + self.positions(torch.arange(tokens.shape[1], device=tokens.device))
            for block in self.blocks:
                x = block(x)
            return self.head(self.norm(x))

    return Model


def attention_functions(torch, flashgen_torch):
    """name -> attention(q, k, v) on [batch, seq, heads, head_dim] tensors, causal, grouped heads."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def sdpa(backend):
        def attention(q, k, v):
            group = q.shape[2] // k.shape[2]
            k, v = (t.repeat_interleave(group, dim=2) for t in (k, v))
            with sdpa_kernel([backend]):
                out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                     is_causal=True)
            return out.transpose(1, 2)
        return attention

    return {
        "sdpa_flash": sdpa(SDPBackend.FLASH_ATTENTION),
        "flashgen": lambda q, k, v: flashgen_torch.attention(q, k, v, causal=True),
        "sdpa_efficient": sdpa(SDPBackend.EFFICIENT_ATTENTION),
        "sdpa_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
    }


def make_batches(torch, args):
    """The same `steps` batches for every run: [batch, seqlen] int64 token ids (input and target shift by one)."""
    generator = torch.Generator(device="cuda").manual_seed(args.seed + 1)
    successors = torch.randint(VOCAB, (VOCAB, SUCCESSORS), device="cuda", generator=generator)
    batches = []
    for _ in range(args.steps):
        phrase = torch.empty(args.batch, PHRASE, dtype=torch.long, device="cuda")
        phrase[:, 0] = torch.randint(VOCAB, (args.batch,), device="cuda", generator=generator)
        for i in range(1, PHRASE):
            choice = torch.randint(SUCCESSORS, (args.batch,), device="cuda", generator=generator)
            phrase[:, i] = successors[phrase[:, i - 1], choice]
        repeats = (args.seqlen + 1 + PHRASE - 1) // PHRASE
        batches.append(phrase.repeat(1, repeats)[:, :args.seqlen + 1])
    return batches


def train(torch, model_class, batches, args):
    """Per-step training losses and the run's seconds; same seed, so the same initial weights every run."""
    import torch.nn.functional as F
    torch.manual_seed(args.seed)
    model = model_class(args.seqlen).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    warmup = max(1, args.steps // 10)

    def learning_rate_factor(step):
        """Linear warm-up over the first tenth, then cosine decay to a tenth of the peak."""
        return min(1.0, (step + 1) / warmup) * (0.1 + 0.45 * (1 + math.cos(math.pi * step / args.steps)))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, learning_rate_factor)
    losses = []
    torch.cuda.synchronize()
    start = time.perf_counter()
    for tokens in batches:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.detach())
    torch.cuda.synchronize()
    return [x.item() for x in losses], time.perf_counter() - start


def slug(text):
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def mean(values):
    return sum(values) / len(values)


def main():
    args = parse_args()
    if args.lib:
        os.environ["FLASHGEN_LIBRARY"] = os.path.abspath(args.lib)
    import torch
    import flashgen
    import flashgen.torch as flashgen_torch

    if not torch.cuda.is_available():
        sys.exit("error: no CUDA device visible to torch")
    device = torch.cuda.get_device_name()
    today = datetime.date.today().isoformat()
    meta = {"device": device, "date": today, "torch_version": torch.__version__, "cuda_version": torch.version.cuda,
            "flashgen_version": flashgen.version()}
    print(f"# {device}, torch {meta['torch_version']}, CUDA {meta['cuda_version']}, flashgen "
          f"{meta['flashgen_version']} ({flashgen.library_path()}); {args.steps} steps of {args.batch} x "
          f"{args.seqlen} tokens", flush=True)

    batches = make_batches(torch, args)
    functions = attention_functions(torch, flashgen_torch)
    curves = {}
    for name in (REFERENCE, "flashgen", *NOISE_GAUGES):
        try:
            curves[name], seconds = train(torch, build_model(torch, functions[name]), batches, args)
        except RuntimeError as error:
            if name not in NOISE_GAUGES:
                raise
            print(f"  {name}: unavailable here ({str(error).splitlines()[0][:160]}); not a noise gauge", flush=True)
            continue
        print(f"  {name}: loss {curves[name][0]:.3f} -> {mean(curves[name][-20:]):.3f} (mean of the last 20 "
              f"steps), {seconds:.1f} s", flush=True)
    gauges = [name for name in NOISE_GAUGES if name in curves]
    if not gauges:
        sys.exit("error: no second SDPA backend ran, so there is no measure of bf16 noise")
    reference = curves[REFERENCE]

    def distance(name, window):
        """Mean |loss - reference loss| over the last `window` steps."""
        return mean([abs(a - b) for a, b in list(zip(curves[name], reference))[-window:]])

    learned = mean(reference[-20:]) < 0.6 * reference[0]
    agrees = True
    for window, what in ((args.steps, "all steps"), (50, "the last 50 steps")):
        noise = max(distance(name, window) for name in gauges)
        allowed = NOISE_FACTOR * noise + NOISE_FLOOR
        ours = distance("flashgen", window)
        agrees = agrees and ours <= allowed
        print(f"  mean |loss - reference| over {what}: flashgen {ours:.4f}; "
              + ", ".join(f"{name} {distance(name, window):.4f}" for name in gauges)
              + f"; allowed {allowed:.4f}", flush=True)

    runs = list(curves)
    os.makedirs(args.out_dir, exist_ok=True)
    stem = os.path.join(args.out_dir, f"train_tiny_transformer_{slug(device)}_{today}")
    with open(stem + ".csv", "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow([*meta, "step", *(f"loss_{name}" for name in runs)])
        for step in range(args.steps):
            writer.writerow([*meta.values(), step, *(f"{curves[name][step]:.6f}" for name in runs)])
    print(f"# wrote {stem}.csv")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7), sharex=True, gridspec_kw={"height_ratios": [2, 1]})
    for name, style in zip(runs, ("-", "--", ":", "-.")):
        top.plot(curves[name], style, label=LABELS[name], linewidth=1.2)
    top.set_ylabel("training loss (nats)")
    top.legend()
    for name in runs[1:]:
        bottom.plot([abs(a - b) for a, b in zip(curves[name], reference)], label=f"|{LABELS[name]} - reference|",
                    linewidth=0.8)
    bottom.set_yscale("log")
    bottom.set_xlabel("step")
    bottom.set_ylabel("|loss difference|")
    bottom.legend()
    figure.suptitle(f"Tiny causal transformer, bf16, same seed and batches: {device}, {today}\n"
                    f"torch {meta['torch_version']}, CUDA {meta['cuda_version']}, flashgen "
                    f"{meta['flashgen_version']}", fontsize=10)
    figure.tight_layout()
    figure.savefig(stem + ".png", dpi=120)
    print(f"# wrote {stem}.png")

    if not learned:
        print(f"FAIL: the reference did not learn (loss {reference[0]:.3f} -> {mean(reference[-20:]):.3f})",
              file=sys.stderr)
    if not agrees:
        print("FAIL: flashgen's loss curve is farther from the reference than bf16 noise allows", file=sys.stderr)
    print("PASS" if learned and agrees else "FAIL")
    return 0 if learned and agrees else 1


if __name__ == "__main__":
    sys.exit(main())
