"""Wall time of a training step of a small transformer (8 layers, head_dim 128, causal, bf16 weights) with its
attention from flashgen.torch.attention or from SDPA's cuDNN backend, in the same process on the same random
batches: forward, backward and an AdamW step, synchronized, median of --steps after warm-up. Also each run's final
loss, so a broken attention shows. CSV with device, date and versions.
    FLASHGEN_LIBRARY=build/libflashgen.so python bench/train_step.py [--batch 16] [--seqlen 1024] [--csv FILE]
"""
import argparse
import datetime
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


class Block(torch.nn.Module):
    def __init__(self, width, heads, attend):
        super().__init__()
        self.heads, self.attend = heads, attend
        self.norm1, self.norm2 = torch.nn.RMSNorm(width), torch.nn.RMSNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width, bias=False)
        self.proj = torch.nn.Linear(width, width, bias=False)
        self.up = torch.nn.Linear(width, 4 * width, bias=False)
        self.down = torch.nn.Linear(4 * width, width, bias=False)

    def forward(self, x):
        batch, seqlen, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, seqlen, 3, self.heads, width // self.heads).unbind(2)
        x = x + self.proj(self.attend(q, k, v).reshape(batch, seqlen, width))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


def flashgen_attention(q, k, v):
    import flashgen.torch as fg
    return fg.attention(q, k, v, causal=True)  # [batch, seqlen, heads, head_dim] views, read in place


def cudnn_attention(q, k, v):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
    return out.transpose(1, 2)


def model(layers, width, heads, vocab, attend):
    torch.manual_seed(0)
    blocks = [Block(width, heads, attend) for _ in range(layers)]
    return torch.nn.Sequential(torch.nn.Embedding(vocab, width), *blocks, torch.nn.RMSNorm(width),
                               torch.nn.Linear(width, vocab, bias=False)).cuda().to(torch.bfloat16)


def step_times(net, batches, steps):
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-4)
    times, loss = [], None
    for i, (tokens, targets) in enumerate(batches):
        torch.cuda.synchronize()
        start = time.perf_counter()
        logits = net(tokens)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if i >= len(batches) - steps:
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times), float(loss)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seqlen", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--csv")
    args = parser.parse_args()
    import flashgen
    vocab, width = 4096, args.heads * args.head_dim
    generator = torch.Generator(device="cuda").manual_seed(1)
    batches = [(torch.randint(vocab, (args.batch, args.seqlen), device="cuda", generator=generator),
                torch.randint(vocab, (args.batch, args.seqlen), device="cuda", generator=generator))
               for _ in range(args.warmup + args.steps)]
    rows = []
    for name, attend in (("flashgen", flashgen_attention), ("cudnn_sdpa", cudnn_attention)):
        net = model(args.layers, width, args.heads, vocab, attend)
        median_ms, loss = step_times(net, batches, args.steps)
        rows.append((name, median_ms, loss))
        del net
        torch.cuda.empty_cache()
    device, date = torch.cuda.get_device_name(), datetime.date.today().isoformat()
    lines = ["device,date,torch,cudnn,flashgen,layers,batch,seqlen,heads,head_dim,impl,step_ms,final_loss"]
    for name, median_ms, loss in rows:
        lines.append(f"{device},{date},{torch.__version__},{torch.backends.cudnn.version()},{flashgen.version()},"
                     f"{args.layers},{args.batch},{args.seqlen},{args.heads},{args.head_dim},{name},{median_ms:.3f},"
                     f"{loss:.4f}")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    print(f"# flashgen step / cuDNN step: {rows[0][1] / rows[1][1]:.3f}")
    if args.csv:
        with open(args.csv, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
