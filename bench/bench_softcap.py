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

import bench_fwd  # the L2-flushed timing of the forward benchmark
import variant_grid
from bench_bwd import Flex, time_calls


def main():
    parser = variant_grid.parser(__doc__)
    parser.add_argument("--softcap", type=float, default=30.0)
    parser.add_argument("--flex", action="store_true", help="add FlexAttention (see above)")
    args = parser.parse_args()

    flashgen, fgt = bench_fwd.import_flashgen_torch(args.lib)
    import torch
    bench = bench_fwd.Bench(args, torch)
    flex = Flex(torch) if args.flex else None

    rows = []
    cap = args.softcap
    for pt in variant_grid.points(torch, flashgen, args):
        causal = pt.causal
        calls = {
            "flashgen": lambda q, k, v: fgt.attention(q, k, v, causal=causal, softcap=cap),
            "flashgen_uncapped": lambda q, k, v: fgt.attention(q, k, v, causal=causal),
        }
        if flex is not None:
            def capped(score, b, h, qi, ki):
                return cap * torch.tanh(score / cap)

            block_mask = flex.block_mask(lambda b, h, qi, ki: qi >= ki, pt.seqlen) if causal else None
            calls["flex"] = flex.call(score_mod=capped, block_mask=block_mask)
        result = pt.result
        result["softcap"] = cap
        time_calls(bench, torch, calls, pt.q, pt.k, pt.v, pt.dout, pt.flops, result, pt.label)
        variant_grid.add_ratios(result, "flashgen_uncapped", ["flex"])
        rows.append(result)
        print(result, flush=True)
    variant_grid.write(rows, "softcap", args.out)


if __name__ == "__main__":
    main()
