#!/usr/bin/env python3
"""User-defined variants (flashgen_variant_create: a mask_mod or score_bias in C++ compiled into the kernels):
flashgen.torch.attention(mask_mod=..., score_bias=...) against flashgen's built-in way to the same attention and, in one
process on the same random tensors with --flex, FlexAttention with the same functions (torch.compile'd
flex_attention; its block mask made once per shape, outside the timing, as a caller would cache it).
  document: causal attention within 8 documents of random lengths packed in one sequence (ids in an int32 buffer);
            flashgen's built-in way is varlen_attention over the documents.
  relative_bias: causal attention with a bias slope * (kv_idx - q_idx) per score (slope a scalar); the built-in
            comparison is the plain causal call (the bias's cost).
  relative_bias_dense: the same bias without a mask, against the plain unmasked call.
With --block-mask the document mask's flashgen call passes a flashgen.torch.BlockMask made once per shape (its block
classes kept across the timed calls, as FlexAttention's block mask is); without it each call classifies its blocks.
With --sdpa, scaled_dot_product_attention too (its memory-efficient backend), with the mask or the bias materialized as
its attn_mask ([batch, 1, seqlen, seqlen] bool for the documents, [1, 1, seqlen, seqlen] bf16 for the bias).
With --tune flashgen tunes each call's problem on its first use (the user variants as problems of their own, with the
call's own tensors), before the timing.
Forward and backward (the backward alone, on a retained graph). TFLOP/s count the unmasked pairs only. Grid: batch *
seqlen = 16384 tokens, heads * head_dim = 2048, bf16. Writes a CSV with device, date and versions.

    python3 bench/bench_user_variants.py [--lib build/libflashgen.so] [--seqlens 4096 16384] [--head-dims 64 128]
                                         [--flex] [--sdpa] [--block-mask] [--tune] [--out FILE]
"""

import bench_fwd  # the L2-flushed timing of the forward benchmark
import variant_grid
from bench_bwd import Flex, time_calls


def document_ids(torch, gen, batch, seqlen, documents):
    """int32 [batch, seqlen]: `documents` runs in each row, their boundaries at distinct random multiples of 64."""
    ids = []
    for _ in range(batch):
        cuts = torch.randperm(seqlen // 64 - 1, generator=gen, device="cuda")[:documents - 1].sort().values + 1
        row = torch.zeros(seqlen, dtype=torch.int32, device="cuda")
        row[cuts * 64] = 1
        ids.append(row.cumsum(0).to(torch.int32))
    return torch.stack(ids)


def main():
    parser = variant_grid.parser(__doc__)
    parser.set_defaults(seqlens=[4096, 16384])
    parser.add_argument("--flex", action="store_true", help="add FlexAttention (see above)")
    parser.add_argument("--sdpa", action="store_true", help="add SDPA with the mask or bias materialized (see above)")
    parser.add_argument("--cases", nargs="+", default=["document", "relative_bias"],
                        choices=["document", "relative_bias", "relative_bias_dense"])
    parser.add_argument("--block-mask", action="store_true",
                        help="the document mask's classes kept across calls in a flashgen.torch.BlockMask")
    parser.add_argument("--tune", action="store_true", help="tune-on-first-use for flashgen's calls")
    args = parser.parse_args()

    flashgen, fgt = bench_fwd.import_flashgen_torch(args.lib)
    flashgen.set_tune_on_first_use(args.tune)
    import torch
    bench = bench_fwd.Bench(args, torch)
    flex = Flex(torch) if args.flex else None
    rows = []
    for case in args.cases:
        for pt in variant_grid.points(torch, flashgen, args):
            causal = case != "relative_bias_dense"
            if pt.causal != causal:
                continue
            n, batch = pt.seqlen, pt.batch
            i = torch.arange(n, device="cuda")  # positions; j: the keys' as a row
            j = i[None, :]
            slope = 0.01
            if case == "document":
                doc = document_ids(torch, pt.gen, batch, n, 8)
                flat = doc.flatten().contiguous()
                lens = [int(c) for b in range(batch) for c in torch.bincount(doc[b]).tolist()]
                cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
                pairs = sum(m * (m + 1) // 2 for m in lens)
                kept = fgt.BlockMask() if args.block_mask else None
                calls = {
                    "flashgen": lambda q, k, v: fgt.attention(
                        q, k, v, causal=True, mask_mod="return doc[batch * n + q_idx] == doc[batch * n + kv_idx];",
                        variant_args={"doc": flat, "n": n}, mask_same_for_heads=True, block_mask=kept),
                    "flashgen_builtin": lambda q, k, v: fgt.varlen_attention(
                        q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu, cu, max(lens), max(lens),
                        causal=True).view(q.shape),
                }
                if flex is not None:
                    block_mask = flex.create_block_mask(
                        lambda b, h, qi, ki: (qi >= ki) & (doc[b, qi] == doc[b, ki]), batch, None, n, n)
                    calls["flex"] = flex.call(block_mask=block_mask)
                if args.sdpa:
                    calls["sdpa_mask"] = variant_grid.sdpa(
                        torch, ((i[:, None] >= i[None, :]) & (doc[:, :, None] == doc[:, None, :]))[:, None])
            else:
                pairs = batch * n * (n + 1) // 2 if causal else batch * n * n
                calls = {
                    "flashgen": lambda q, k, v: fgt.attention(
                        q, k, v, causal=causal, score_bias="return slope * float(kv_idx - q_idx);",
                        variant_args={"slope": slope}),
                    "flashgen_builtin": lambda q, k, v: fgt.attention(q, k, v, causal=causal),
                }
                if flex is not None:
                    block_mask = flex.block_mask(lambda b, h, qi, ki: qi >= ki, n) if causal else None
                    calls["flex"] = flex.call(score_mod=lambda s, b, h, qi, ki: s + slope * (ki - qi).float(),
                                              block_mask=block_mask)
                if args.sdpa:
                    if causal:
                        bias = (slope * (i[None, :] - i[:, None]).float()).masked_fill(i[None, :] > i[:, None],
                                                                                         float("-inf"))
                    else:  # less slope * (n - 1 - q_idx), constant per row: the largest biases near 0, held by bf16
                        bias = slope * (i[None, :] - (n - 1)).float()[None, :].expand(n, n)
                    calls["sdpa_mask"] = variant_grid.sdpa(torch, bias[None, None].to(torch.bfloat16))
            flops = 4.0 * pt.heads * pairs * pt.head_dim
            result = dict(pt.result, case=case, block_mask=int(args.block_mask and case == "document"),
                          tuned=int(args.tune), unmasked_pairs=pairs)
            time_calls(bench, torch, calls, pt.q, pt.k, pt.v, pt.dout, flops, result, f"{case} {pt.label}")
            # Each output on 64 rows against an fp32 reference of the same function.
            rows_at = torch.linspace(0, n - 1, 64, device="cuda").long()
            scores = torch.einsum("bqhd,bkhd->bhqk", pt.q[:, rows_at].float(), pt.k.float()) / pt.head_dim ** 0.5
            visible = (j <= rows_at[:, None] if causal else j >= 0)[None, None]
            if case == "document":
                visible = visible & (doc[:, rows_at][:, :, None] == doc[:, None, :])[:, None]
            else:
                scores = scores + slope * (j - rows_at[:, None]).float()
            want = torch.einsum("bhqk,bkhd->bqhd", scores.masked_fill(~visible, float("-inf")).softmax(-1),
                                pt.v.float())
            variant_grid.add_errors(torch, result, calls, pt, rows_at, want, skip=())
            variant_grid.add_ratios(result, "flashgen_builtin", ["flex", "sdpa_mask"])
            rows.append(result)
            print(result, flush=True)
    variant_grid.write(rows, "user_variants", args.out)


if __name__ == "__main__":
    main()
