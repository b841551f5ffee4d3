#!/usr/bin/env python3
"""Attention sinks (gpt-oss: a learnable logit per head that joins every row's softmax denominator with no value):
flashgen.torch.attention(sinks=...) against its own call without sinks and, in one process on the same random
tensors with --flex, FlexAttention as sinks are written with it (torch.compile'd flex_attention returning the rows'
LSE, the output rescaled by sigmoid(lse - sink), one compiled function). Forward and backward (the backward timed
alone on a retained graph; the sinks are a parameter, so both take their gradient). Grid: batch * seqlen = 16384
tokens, heads * head_dim = 2048, causal on and off, bf16, sinks drawn about the rows' LSE.
Reports TFLOP/s (the plain attention's FLOPs) and the ratios; writes a CSV with device, date and versions.

    python3 bench/bench_sinks.py [--lib build/libflashgen.so] [--seqlens 1024 4096 16384] [--head-dims 64 128]
                                 [--flex] [--out FILE]
"""

import math

import bench_fwd  # the L2-flushed timing of the forward benchmark
import variant_grid
from bench_bwd import Flex, time_calls


def main():
    parser = variant_grid.parser(__doc__)
    parser.add_argument("--flex", action="store_true", help="add FlexAttention (see above)")
    args = parser.parse_args()

    flashgen, fgt = bench_fwd.import_flashgen_torch(args.lib)
    import torch
    bench = bench_fwd.Bench(args, torch)
    flex = Flex(torch) if args.flex else None
    if flex is not None:
        def flex_with_sinks(q, k, v, sinks, block_mask):
            out, lse = flex.flex_attention(q, k, v, block_mask=block_mask, return_lse=True)
            # e^lse / (e^lse + e^sink): the keys' share of a softmax that also holds the sink.
            return out * torch.sigmoid(lse - sinks[None, :, None]).unsqueeze(-1).to(out.dtype)

        compiled_flex_with_sinks = torch.compile(flex_with_sinks, dynamic=False)

    rows = []
    for pt in variant_grid.points(torch, flashgen, args):
        # Unit-variance scores over n keys give row LSEs near log(n) + 0.5: sinks about there take a sizeable
        # share of each row.
        sinks = (torch.randn(pt.heads, device="cuda", generator=pt.gen) + math.log(pt.seqlen)).requires_grad_()
        causal = pt.causal
        calls = {
            "flashgen": lambda q, k, v: fgt.attention(q, k, v, causal=causal, sinks=sinks),
            "flashgen_plain": lambda q, k, v: fgt.attention(q, k, v, causal=causal),
        }
        if flex is not None:
            block_mask = flex.block_mask(lambda b, h, qi, ki: qi >= ki, pt.seqlen) if causal else None

            def flex_call(q, k, v, block_mask=block_mask):
                out = compiled_flex_with_sinks(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), sinks,
                                               block_mask)
                return out.transpose(1, 2)

            calls["flex"] = flex_call
        result = pt.result
        time_calls(bench, torch, calls, pt.q, pt.k, pt.v, pt.dout, pt.flops, result, pt.label)
        # Each output on 64 rows against an fp32 reference with the sinks.
        q, k, v = pt.q, pt.k, pt.v
        rows_at = torch.linspace(0, pt.seqlen - 1, 64, device="cuda").long()
        scores = torch.einsum("bqhd,bkhd->bhqk", q[:, rows_at].float(), k.float()) / pt.head_dim ** 0.5
        j = torch.arange(pt.seqlen, device="cuda")
        if causal:
            scores = scores.masked_fill(j[None, :] > rows_at[:, None], float("-inf"))
        sink_column = sinks.detach()[None, :, None, None].expand(pt.batch, pt.heads, 64, 1)
        weights = torch.cat([scores, sink_column], dim=-1).softmax(-1)[..., :-1]
        want = torch.einsum("bhqk,bkhd->bqhd", weights, v.float())
        variant_grid.add_errors(torch, result, calls, pt, rows_at, want, skip=("flashgen_plain",))
        variant_grid.add_ratios(result, "flashgen_plain", ["flex"])
        rows.append(result)
        print(result, flush=True)
    variant_grid.write(rows, "sinks", args.out)


if __name__ == "__main__":
    main()
