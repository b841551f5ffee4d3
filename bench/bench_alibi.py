#!/usr/bin/env python3
"""ALiBi (a per-head bias -slope · |i + sk - sq - j| on every score): flashgen.torch.attention(alibi_slopes=...)
against its own call without the bias and, in one process on the same random tensors, the peers that express it:
FlexAttention (torch.compile'd flex_attention with the bias as its score_mod) with --flex, and
scaled_dot_product_attention given the bias as a materialized float attn_mask (the memory-efficient backend; the
bias tensor is heads · seqlen² elements, so only up to --sdpa-max-seqlen) with --sdpa. Forward and backward (the
backward timed alone on a retained graph). Grid: batch * seqlen = 16384 tokens, heads * head_dim = 2048, causal on
and off, bf16, the standard slopes 2^(-8 (h + 1) / heads).
Reports TFLOP/s (the plain attention's FLOPs: the bias adds no product) and the ratios; writes a CSV with device,
date and versions.

    python3 bench/bench_alibi.py [--lib build/libflashgen.so] [--seqlens 1024 4096 16384] [--head-dims 64 128]
                                 [--flex] [--sdpa] [--out FILE]
"""

import argparse
import datetime
import os

import bench_fwd  # the L2-flushed timing of the forward benchmark
from bench_bwd import Flex, time_calls


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lib", default=None)
    parser.add_argument("--seqlens", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--samples", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--flush-mb", type=int, default=256)
    parser.add_argument("--flex", action="store_true", help="add FlexAttention (see above)")
    parser.add_argument("--sdpa", action="store_true", help="add SDPA with a materialized bias (see above)")
    parser.add_argument("--sdpa-max-seqlen", type=int, default=4096)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    flashgen, fgt = bench_fwd.import_flashgen_torch(args.lib)
    import torch
    import torch.nn.functional as F
    bench = bench_fwd.Bench(args, torch)
    flex = Flex(torch) if args.flex else None

    device = torch.cuda.get_device_name()
    date = datetime.date.today().isoformat()
    rows = []
    for head_dim in args.head_dims:
        heads = 2048 // head_dim
        slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)], device="cuda")
        for seqlen in args.seqlens:
            batch = max(1, 16384 // seqlen)
            for causal in (False, True):
                gen = torch.Generator(device="cuda").manual_seed(seqlen + head_dim)
                q, k, v, dout = (torch.randn(batch, seqlen, heads, head_dim, device="cuda", generator=gen,
                                             dtype=torch.bfloat16) for _ in range(4))
                flops = 4.0 * batch * heads * seqlen * seqlen * head_dim * (0.5 if causal else 1.0)
                calls = {
                    "flashgen": lambda q, k, v: fgt.attention(q, k, v, causal=causal, alibi_slopes=slopes),
                    "flashgen_plain": lambda q, k, v: fgt.attention(q, k, v, causal=causal),
                }
                if flex is not None:
                    def biased(score, b, h, qi, ki):
                        return score - slopes[h] * (qi - ki).abs()

                    block_mask = flex.block_mask(lambda b, h, qi, ki: qi >= ki, seqlen) if causal else None
                    calls["flex"] = flex.call(score_mod=biased, block_mask=block_mask)
                if args.sdpa and seqlen <= args.sdpa_max_seqlen:
                    i = torch.arange(seqlen, device="cuda")
                    bias = -slopes[:, None, None] * (i[:, None] - i[None, :]).abs()
                    if causal:
                        bias = bias.masked_fill(i[None, :] > i[:, None], float("-inf"))
                    bias = bias[None].to(torch.bfloat16)

                    def sdpa_call(q, k, v, bias=bias):
                        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                              attn_mask=bias).transpose(1, 2)

                    calls["sdpa_bias"] = sdpa_call
                result = {"device": device, "date": date, "torch": torch.__version__, "flashgen": flashgen.version(),
                          "dtype": "bf16", "head_dim": head_dim, "batch": batch, "seqlen": seqlen, "heads": heads,
                          "causal": int(causal)}
                time_calls(bench, torch, calls, q, k, v, dout, flops, result, f"d{head_dim} {seqlen} causal={causal}")
                # Each output on 64 rows against an fp32 reference of the biased attention.
                rows_at = torch.linspace(0, seqlen - 1, 64, device="cuda").long()
                scores = torch.einsum("bqhd,bkhd->bhqk", q[:, rows_at].float(), k.float()) / head_dim ** 0.5
                j = torch.arange(seqlen, device="cuda")
                scores = scores - slopes[None, :, None, None] * (rows_at[:, None] - j[None, :]).abs()
                if causal:
                    scores = scores.masked_fill(j[None, :] > rows_at[:, None], float("-inf"))
                want = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v.float())
                for name, call in calls.items():
                    if name == "flashgen_plain" or result.get(f"{name}_fwd_ms") != result.get(f"{name}_fwd_ms"):
                        continue
                    with torch.no_grad():
                        got = call(q, k, v)[:, rows_at].float()
                    result[f"{name}_max_error"] = round((got - want).abs().max().item(), 4)
                for p in ("fwd", "bwd"):
                    mine = result[f"flashgen_{p}_tflops"]
                    result[f"{p}_vs_plain"] = round(mine / result[f"flashgen_plain_{p}_tflops"], 3)
                    for peer in ("flex", "sdpa_bias"):
                        if f"{peer}_{p}_tflops" in result:
                            result[f"{p}_vs_{peer}"] = round(mine / result[f"{peer}_{p}_tflops"], 3)
                rows.append(result)
                print(result, flush=True)
    keys = []
    for row in rows:
        keys += [key for key in row if key not in keys]
    out = args.out or os.path.join("bench", "results", f"alibi_{bench_fwd.slug(device)}_{date}.csv")
    bench_fwd.write_csv(out, keys, rows)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
