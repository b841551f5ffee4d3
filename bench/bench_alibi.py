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

import bench_fwd  # the L2-flushed timing of the forward benchmark
import variant_grid
from bench_bwd import Flex, time_calls


def main():
    parser = variant_grid.parser(__doc__)
    parser.add_argument("--flex", action="store_true", help="add FlexAttention (see above)")
    parser.add_argument("--sdpa", action="store_true", help="add SDPA with a materialized bias (see above)")
    parser.add_argument("--sdpa-max-seqlen", type=int, default=4096)
    args = parser.parse_args()

    flashgen, fgt = bench_fwd.import_flashgen_torch(args.lib)
    import torch
    bench = bench_fwd.Bench(args, torch)
    flex = Flex(torch) if args.flex else None

    rows = []
    for pt in variant_grid.points(torch, flashgen, args):
        heads, seqlen, causal = pt.heads, pt.seqlen, pt.causal
        slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)], device="cuda")
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
            calls["sdpa_bias"] = variant_grid.sdpa(torch, bias[None].to(torch.bfloat16))
        result = pt.result
        q, k, v = pt.q, pt.k, pt.v
        time_calls(bench, torch, calls, q, k, v, pt.dout, pt.flops, result, pt.label)
        # Each output on 64 rows against an fp32 reference of the biased attention.
        rows_at = torch.linspace(0, seqlen - 1, 64, device="cuda").long()
        scores = torch.einsum("bqhd,bkhd->bhqk", q[:, rows_at].float(), k.float()) / pt.head_dim ** 0.5
        j = torch.arange(seqlen, device="cuda")
        scores = scores - slopes[None, :, None, None] * (rows_at[:, None] - j[None, :]).abs()
        if causal:
            scores = scores.masked_fill(j[None, :] > rows_at[:, None], float("-inf"))
        want = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v.float())
        variant_grid.add_errors(torch, result, calls, pt, rows_at, want, skip=("flashgen_plain",))
        variant_grid.add_ratios(result, "flashgen_plain", ["flex", "sdpa_bias"])
        rows.append(result)
        print(result, flush=True)
    variant_grid.write(rows, "alibi", args.out)


if __name__ == "__main__":
    main()
