#!/usr/bin/env python3
"""Sliding-window attention (a causal window of W keys before the diagonal, FlashAttention's window_size=(W, 0)):
flashgen.torch.attention(window_size=...) against flashgen's own plain causal call (per unmasked FLOP: the goal is
the window within 5% of it) and FlexAttention (torch.compile'd flex_attention with the window as its block mask,
the peer that expresses it as a block mask; with --sdpa also scaled_dot_product_attention's memory-efficient backend
with the window materialized as a [1, 1, seqlen, seqlen] bool attn_mask), in one process, on the same random tensors,
forward and backward (the backward timed alone on a retained graph). Each output is also checked on 64 rows against
an fp32 reference (max_abs_err). Grid: one sequence of 16384 tokens by default, heads * head_dim = 2048, bf16.
With --chunks, chunked causal attention too (Llama 4's attention_chunk: each query sees the keys of its own chunk
up to itself; flashgen.torch.attention(causal=True, attention_chunk=C), FlexAttention with the chunk as its block
mask), and flashgen's causal call on the chunks as a batch of their own (the same unmasked pairs: what the chunk's
kernels would ideally match). Reports TFLOP/s over the unmasked score pairs (a window's, a chunk's, a causal
row's) and the ratios; writes a CSV with device, date and versions.

    python3 bench/bench_window.py [--lib build/libflashgen.so] [--seqlens 16384] [--windows 1024 4096]
                                  [--chunks 4096 8192] [--head-dims 64 128] [--no-flex] [--sdpa] [--out FILE]
"""

import argparse
import datetime
import os

import bench_fwd  # the L2-flushed timing of the forward benchmark
import variant_grid
from bench_bwd import Flex, retained_backward, time_calls


def visible_pairs(seqlen, window):
    """Score pairs a causal window of `window` keys before the diagonal leaves (window < 0: plain causal)."""
    if window < 0 or window + 1 >= seqlen:
        return seqlen * (seqlen + 1) // 2
    return (window + 1) * seqlen - window * (window + 1) // 2


def chunk_pairs(seqlen, chunk):
    """Score pairs chunked causal attention leaves: a causal triangle per chunk of `chunk` keys."""
    full, rest = divmod(seqlen, chunk)
    return full * chunk * (chunk + 1) // 2 + rest * (rest + 1) // 2


def reference_rows(torch, q, k, v, window, count=64, chunk=0):
    """fp32 outputs of `count` query rows spread over the sequence (the last included) under the causal window (or
    in causal chunks of `chunk` keys), and the rows, to check each implementation's output against."""
    batch, seqlen, heads, head_dim = q.shape
    rows = torch.linspace(0, seqlen - 1, count, device=q.device).long()
    keys = torch.arange(seqlen, device=q.device)
    visible = (keys[None, :] <= rows[:, None]) & (rows[:, None] - keys[None, :] <= window)
    if chunk > 0:
        visible = (keys[None, :] <= rows[:, None]) & (keys[None, :] // chunk == rows[:, None] // chunk)
    s = torch.einsum("brhd,bkhd->bhrk", q[:, rows].float(), k.float()) / head_dim ** 0.5
    p = s.masked_fill(~visible, float("-inf")).softmax(-1)
    return torch.einsum("bhrk,bkhd->brhd", p, v.float()), rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lib", default=None)
    parser.add_argument("--seqlens", type=int, nargs="+", default=[16384])
    parser.add_argument("--windows", type=int, nargs="*", default=[1024, 4096])
    parser.add_argument("--chunks", type=int, nargs="*", default=[])
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--samples", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--flush-mb", type=int, default=256)
    parser.add_argument("--no-flex", action="store_true", help="leave FlexAttention out")
    parser.add_argument("--sdpa", action="store_true", help="add SDPA with a materialized mask (see above)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    flashgen, fgt = bench_fwd.import_flashgen_torch(args.lib)
    import torch
    bench = bench_fwd.Bench(args, torch)
    flex = None if args.no_flex else Flex(torch)

    device = torch.cuda.get_device_name()
    date = datetime.date.today().isoformat()
    rows = []
    for head_dim in args.head_dims:
        heads = 2048 // head_dim
        for seqlen in args.seqlens:
            batch = max(1, 16384 // seqlen)
            gen = torch.Generator(device="cuda").manual_seed(seqlen + head_dim)
            q, k, v, dout = (torch.randn(batch, seqlen, heads, head_dim, device="cuda", generator=gen,
                                         dtype=torch.bfloat16) for _ in range(4))
            causal_flops = 4.0 * batch * heads * head_dim * visible_pairs(seqlen, -1)
            causal_fwd = bench.time_ms(lambda: fgt.attention(q, k, v, causal=True))[0]
            causal_bwd = bench.time_ms(retained_backward(torch, lambda q, k, v: fgt.attention(q, k, v, causal=True),
                                                         q, k, v, dout))[0]
            for window, chunk in [(w, 0) for w in args.windows] + [(-1, c) for c in args.chunks]:
                if chunk > 0:
                    flops = 4.0 * batch * heads * head_dim * chunk_pairs(seqlen, chunk)
                    calls = {"flashgen": lambda q, k, v: fgt.attention(q, k, v, causal=True, attention_chunk=chunk)}
                else:
                    flops = 4.0 * batch * heads * head_dim * visible_pairs(seqlen, window)
                    calls = {"flashgen": lambda q, k, v: fgt.attention(q, k, v, causal=True,
                                                                       window_size=(window, -1))}
                if flex is not None:
                    def in_window(b, h, qi, ki, window=window):
                        return (qi >= ki) & (qi - ki <= window)

                    def in_chunk(b, h, qi, ki, chunk=chunk):
                        return (qi >= ki) & (qi // chunk == ki // chunk)

                    calls["flex"] = flex.call(block_mask=flex.block_mask(in_chunk if chunk > 0 else in_window, seqlen))
                if args.sdpa:
                    i = torch.arange(seqlen, device="cuda")
                    visible = (i[:, None] >= i[None, :]) & ((i[:, None] // chunk == i[None, :] // chunk) if chunk > 0
                                                            else (i[:, None] - i[None, :] <= window))
                    calls["sdpa_mask"] = variant_grid.sdpa(torch, visible[None, None])
                result = {"device": device, "date": date, "torch": torch.__version__, "flashgen": flashgen.version(),
                          "dtype": "bf16", "head_dim": head_dim, "batch": batch, "seqlen": seqlen, "heads": heads,
                          "window": window, "chunk": chunk,
                          "causal_fwd_tflops": round(causal_flops / causal_fwd / 1e9, 1),
                          "causal_bwd_tflops": round(2.5 * causal_flops / causal_bwd / 1e9, 1)}
                label = f"d{head_dim} {seqlen} " + (f"chunk {chunk}" if chunk > 0 else f"window {window}")
                if chunk > 0 and seqlen % chunk == 0:  # the chunks as sequences of a batch: the same pairs
                    def as_batch(t, chunk=chunk):
                        return t.reshape(batch * seqlen // chunk, chunk, heads, head_dim)

                    calls["flashgen_chunks_as_batch"] = lambda q, k, v: fgt.attention(
                        as_batch(q), as_batch(k), as_batch(v), causal=True).reshape(q.shape)
                time_calls(bench, torch, calls, q, k, v, dout, flops, result, label)
                for p in ("fwd", "bwd"):
                    mine = result[f"flashgen_{p}_tflops"]
                    result[f"{p}_vs_causal_per_flop"] = round(mine / result[f"causal_{p}_tflops"], 3)
                    for peer in ("flex", "sdpa_mask"):
                        if f"{peer}_{p}_tflops" in result:
                            result[f"{p}_vs_{peer}"] = round(mine / result[f"{peer}_{p}_tflops"], 3)
                    if f"flashgen_chunks_as_batch_{p}_tflops" in result:
                        result[f"{p}_vs_chunks_as_batch"] = round(mine / result[f"flashgen_chunks_as_batch_{p}_tflops"],
                                                                  3)
                want, rows_checked = reference_rows(torch, q, k, v, window, chunk=chunk)
                for name, call in calls.items():
                    if not variant_grid.ran(result, name):
                        continue
                    got = call(q, k, v)[:, rows_checked].float()
                    result[f"{name}_max_abs_err"] = round((got - want).abs().max().item(), 5)
                rows.append(result)
                print(result, flush=True)
    name = "window" if args.windows else "chunk"
    out = args.out or os.path.join("bench", "results", f"{name}_{bench_fwd.slug(device)}_{date}.csv")
    bench_fwd.write_csv(out, list(rows[0].keys()), rows)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
