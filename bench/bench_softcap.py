#!/usr/bin/env python3
"""Soft-capped attention (softcap · tanh(s / softcap) on every score): flashgen.torch.attention(softcap=...) against
its own uncapped call and, with --flex, against FlexAttention (torch.compile'd flex_attention with the cap as its
score_mod, the peer that expresses it), in one process, on the same random tensors, forward and backward (the
backward timed alone on a retained graph). Grid: batch * seqlen = 16384 tokens, heads * head_dim = 2048, causal on
and off, bf16.
Reports TFLOP/s (the uncapped attention's FLOPs: the cap adds no product) and the ratios; writes a CSV with device,
date and versions.

    python3 bench/bench_softcap.py [--lib build/libflashgen.so] [--seqlens 1024 4096 16384] [--head-dims 64 128]
                                   [--softcap 30] [--flex] [--out FILE]
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
    parser.add_argument("--softcap", type=float, default=30.0)
    parser.add_argument("--samples", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--flush-mb", type=int, default=256)
    parser.add_argument("--flex", action="store_true", help="add FlexAttention (see above)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    flashgen, fgt = bench_fwd.import_flashgen_torch(args.lib)
    import torch
    bench = bench_fwd.Bench(args, torch)
    flex = Flex(torch) if args.flex else None

    device = torch.cuda.get_device_name()
    date = datetime.date.today().isoformat()
    rows = []
    cap = args.softcap
    for head_dim in args.head_dims:
        heads = 2048 // head_dim
        for seqlen in args.seqlens:
            batch = max(1, 16384 // seqlen)
            for causal in (False, True):
                gen = torch.Generator(device="cuda").manual_seed(seqlen + head_dim)
                q, k, v, dout = (torch.randn(batch, seqlen, heads, head_dim, device="cuda", generator=gen,
                                             dtype=torch.bfloat16) for _ in range(4))
                flops = 4.0 * batch * heads * seqlen * seqlen * head_dim * (0.5 if causal else 1.0)
                calls = {
                    "flashgen": lambda q, k, v: fgt.attention(q, k, v, causal=causal, softcap=cap),
                    "flashgen_uncapped": lambda q, k, v: fgt.attention(q, k, v, causal=causal),
                }
                if flex is not None:
                    def capped(score, b, h, qi, ki):
                        return cap * torch.tanh(score / cap)

                    block_mask = flex.block_mask(lambda b, h, qi, ki: qi >= ki, seqlen) if causal else None
                    calls["flex"] = flex.call(score_mod=capped, block_mask=block_mask)
                result = {"device": device, "date": date, "torch": torch.__version__, "flashgen": flashgen.version(),
                          "dtype": "bf16", "head_dim": head_dim, "batch": batch, "seqlen": seqlen, "heads": heads,
                          "causal": int(causal), "softcap": cap}
                time_calls(bench, torch, calls, q, k, v, dout, flops, result, f"d{head_dim} {seqlen} causal={causal}")
                for p in ("fwd", "bwd"):
                    mine = result[f"flashgen_{p}_tflops"]
                    result[f"{p}_vs_uncapped"] = round(mine / result[f"flashgen_uncapped_{p}_tflops"], 3)
                    if flex is not None:
                        result[f"{p}_vs_flex"] = round(mine / result[f"flex_{p}_tflops"], 3)
                rows.append(result)
                print(result, flush=True)
    out = args.out or os.path.join("bench", "results", f"softcap_{bench_fwd.slug(device)}_{date}.csv")
    bench_fwd.write_csv(out, list(rows[0].keys()), rows)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
