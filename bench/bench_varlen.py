#!/usr/bin/env python3
"""Packed variable-length prefill: flashgen.torch.varlen_attention on a batch of mixed lengths against flashgen's
own dense forward on the same number of tokens, and against SDPA (FlashAttention-2 and cuDNN backends) run
sequence by sequence and on the batch padded to its longest sequence, in one process, on the same random
tensors. Reports TFLOP/s over the visible (query, key) pairs of the real sequences (4 * pairs * head_dim * heads;
the padded SDPA run is charged only for those too). --backward times the backward instead (2.5 times the
forward's FLOPs: five products instead of two), each implementation's gradients of its own forward's outputs.
--page-sizes adds the forward over the same keys and values moved into a paged cache of each page size (prefill
against a KV cache: the pages shuffled, read through a block table), checked against the contiguous call's output.
--fp8 adds the FP8 forward (the same values rounded to e4m3, bf16 out) packed, paged and as a dense batch.
Writes a CSV with device, date and versions.

    python3 bench/bench_varlen.py [--backward] [--sequences 64] [--min-len 128] [--max-len 8192]
        [--page-sizes 16,64,256] [--head-dims 64,128] [--fp8] [--out FILE]
"""
import argparse
import datetime
import random

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashgen
import flashgen.torch as fg


def timed_ms(fn, samples, flush):
    """Mean milliseconds per call of fn over `samples` calls queued back to back between two CUDA events, after
    an L2 flush. The calls here take milliseconds each, so the host stays ahead of the GPU."""
    for _ in range(3):
        fn()
    flush.zero_()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(samples):
        fn()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) / samples


def sdpa_ms(calls, causal, args, flush):
    """SDPA over each (q, k, v) of calls, one after the other: the forward, or with args.backward the gradients
    of the outputs of one forward (kept for every timed call)."""
    if not args.backward:
        with torch.no_grad():
            return timed_ms(lambda: [F.scaled_dot_product_attention(*c, is_causal=causal) for c in calls],
                            args.samples, flush)
    inputs = [tuple(t.detach().requires_grad_() for t in c) for c in calls]
    outs = [F.scaled_dot_product_attention(*c, is_causal=causal) for c in inputs]
    douts = [torch.randn_like(o) for o in outs]
    flat = [t for c in inputs for t in c]
    return timed_ms(lambda: torch.autograd.grad(outs, flat, douts, retain_graph=True), args.samples, flush)


def visible_pairs(sq, sk, causal):
    if not causal:
        return sq * sk
    # bottom-right: query i sees min(sk, i + sk - sq + 1) keys, at least 0
    return sum(max(0, min(sk, i + sk - sq + 1)) for i in range(sq))


def paged_cache(k, v, lens, page_size, generator):
    """k and v ([total, heads, head_dim], sequences packed by lens) moved into shuffled pages of page_size rows, and
    the block table [sequences, max_pages] that finds them."""
    max_pages = (max(lens) + page_size - 1) // page_size
    num_pages = len(lens) * max_pages
    order = torch.randperm(num_pages, generator=generator).to(torch.int32).cuda()
    table = order.view(len(lens), max_pages)
    caches = []
    for t in (k, v):
        # Bytes moved as bytes: FP8 tensors take no indexed copies.
        rows_of = t.view(torch.uint8) if t.element_size() == 1 else t
        cache = torch.zeros(num_pages * page_size, *t.shape[1:], device=t.device, dtype=rows_of.dtype)
        start = 0
        for b, n in enumerate(lens):
            rows = torch.arange(n, device=t.device)
            cache[table[b, rows // page_size].long() * page_size + rows % page_size] = rows_of[start:start + n]
            start += n
        caches.append(cache.view(t.dtype).view(num_pages, page_size, *t.shape[1:]))
    return caches[0], caches[1], table


def packed_and_paged(q, k, v, cu, lens, causal, suffix, args, flush):
    """Milliseconds of flashgen's packed forward and of the same over paged caches of each of args.page_sizes, by
    call name (suffix after each)."""
    results = {}
    call = lambda: fg.varlen_attention(q, k, v, cu, cu, max(lens), max(lens), causal=causal)
    results["flashgen varlen" + suffix] = timed_ms(call, args.samples, flush)
    want = call()
    for page_size in [int(x) for x in args.page_sizes.split(",") if x]:
        kc, vc, table = paged_cache(k, v, lens, page_size, torch.Generator().manual_seed(args.seed))
        call = lambda: fg.varlen_attention(q, kc, vc, cu, cu, max(lens), max(lens), causal=causal, block_table=table)
        error = (call().float() - want.float()).abs().max().item()
        if error > 0.0:  # the same tiles give the same bits; tiles of the paged call's own differ by rounding
            print(f"paged {page_size}{suffix}: differs from the contiguous call by up to {error}")
        results[f"flashgen paged {page_size}{suffix}"] = timed_ms(call, args.samples, flush)
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sequences", type=int, default=64)
    parser.add_argument("--min-len", type=int, default=128)
    parser.add_argument("--max-len", type=int, default=8192)
    parser.add_argument("--hidden", type=int, default=2048, help="heads * head_dim")
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backward", action="store_true", help="time the backward pass")
    parser.add_argument("--page-sizes", default="", help="comma-separated page sizes: the forward over paged caches")
    parser.add_argument("--no-sdpa", action="store_true", help="time flashgen's calls only")
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--fp8", action="store_true", help="the FP8 forward too: packed, paged and dense, e4m3")
    parser.add_argument("--out")
    args = parser.parse_args()

    rng = random.Random(args.seed)
    lens = [rng.randint(args.min_len, args.max_len) for _ in range(args.sequences)]
    total = sum(lens)
    cu = torch.tensor([0] + [sum(lens[:i + 1]) for i in range(len(lens))], dtype=torch.int32, device="cuda")
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    device = torch.cuda.get_device_name()
    rows = []
    print(f"{args.sequences} sequences of {args.min_len}..{args.max_len} tokens, {total} in all")
    for dtype in (torch.bfloat16,):
        for head_dim in [int(x) for x in args.head_dims.split(",")]:
            heads = args.hidden // head_dim
            for causal in (False, True):
                torch.manual_seed(args.seed)
                q, k, v = (torch.randn(total, heads, head_dim, device="cuda", dtype=dtype) for _ in range(3))
                pairs = sum(visible_pairs(n, n, causal) for n in lens)
                factor = 2.5 if args.backward else 1.0
                flops = 4.0 * factor * pairs * head_dim * heads
                mask = "bottom_right" if causal else "none"
                results = {}
                with torch.no_grad():
                    if args.backward:
                        out, lse = torch.ops.flashgen.varlen_attention_forward(q, k, v, cu, cu, None, max(lens),
                                                                               max(lens), 0.0, mask, False)
                        dout = torch.randn_like(out)
                        results["flashgen varlen"] = timed_ms(
                            lambda: torch.ops.flashgen.varlen_attention_backward(
                                dout, q, k, v, out, lse, cu, cu, max(lens), max(lens), 0.0, mask, False),
                            args.samples, flush)
                    else:
                        results.update(packed_and_paged(q, k, v, cu, lens, causal, "", args, flush))
                    # The same tokens as one dense batch of sequences of the mean length.
                    mean = total // args.sequences
                    dq, dk, dv = (t[: mean * args.sequences].view(args.sequences, mean, heads, head_dim)
                                  for t in (q, k, v))
                    if args.fp8 and not args.backward:
                        q8, k8, v8 = (t.to(torch.float8_e4m3fn) for t in (q, k, v))
                        results.update(packed_and_paged(q8, k8, v8, cu, lens, causal, " e4m3", args, flush))
                        dq8, dk8, dv8 = (t[: mean * args.sequences].view(args.sequences, mean, heads, head_dim)
                                         for t in (q8, k8, v8))
                        # (milliseconds, FLOPs): the dense batch's own pairs.
                        results["flashgen dense e4m3"] = (
                            timed_ms(lambda: fg.attention(dq8, dk8, dv8, causal=causal), args.samples, flush),
                            4.0 * args.sequences * visible_pairs(mean, mean, causal) * head_dim * heads)
                    dense_flops = 4.0 * factor * args.sequences * visible_pairs(mean, mean, causal) * head_dim * heads
                    if args.backward:
                        dense_out, dense_lse = torch.ops.flashgen.attention_forward(dq, dk, dv, 0.0, mask, "bshd", False)
                        dense_dout = torch.randn_like(dense_out)
                        dense_ms = timed_ms(lambda: torch.ops.flashgen.attention_backward(
                            dense_dout, dq, dk, dv, dense_out, dense_lse, 0.0, mask, "bshd", False), args.samples, flush)
                    else:
                        dense_ms = timed_ms(lambda: fg.attention(dq, dk, dv, causal=causal), args.samples, flush)
                    # SDPA sequence by sequence (its kernels take no offsets), and padded to the longest.
                    starts = cu.tolist()
                    slices = [tuple(t[s:e].transpose(0, 1)[None] for t in (q, k, v))
                              for s, e in zip(starts, starts[1:])]
                    padded = [torch.zeros(args.sequences, heads, max(lens), head_dim, device="cuda", dtype=dtype)
                              for _ in range(3)]
                    for i, (s, e) in enumerate(zip(starts, starts[1:])):
                        for p, t in zip(padded, (q, k, v)):
                            p[i, :, : e - s] = t[s:e].transpose(0, 1)
                peers = () if args.no_sdpa else (("SDPA FA2", SDPBackend.FLASH_ATTENTION),
                                                  ("SDPA cuDNN", SDPBackend.CUDNN_ATTENTION))
                for name, backend in peers:
                    with sdpa_kernel([backend]):
                        try:
                            results[name + " per sequence"] = sdpa_ms(slices, causal, args, flush)
                            results[name + " padded"] = sdpa_ms([padded], causal, args, flush)
                        except RuntimeError as error:
                            print(f"{name}: {error}".splitlines()[0])
                dense_tflops = dense_flops / dense_ms / 1e9
                for name, timing in results.items():
                    ms, call_flops = timing if isinstance(timing, tuple) else (timing, flops)
                    tflops = call_flops / ms / 1e9
                    rows.append((device, datetime.date.today().isoformat(), torch.__version__, flashgen.version(),
                                 "backward" if args.backward else "forward", str(dtype).split(".")[-1], head_dim, int(causal), args.sequences, total, name,
                                 f"{ms:.4f}", f"{tflops:.1f}", f"{tflops / dense_tflops:.3f}"))
                    print(f"d{head_dim} causal={int(causal)} {name:28} {ms:8.3f} ms {tflops:7.1f} TFLOP/s "
                          f"{tflops / dense_tflops:.2f}x flashgen dense ({dense_tflops:.1f} TFLOP/s)")
    if args.out:
        with open(args.out, "w") as f:
            f.write("device,date,torch,flashgen,pass,dtype,head_dim,causal,sequences,tokens,call,mean_ms,tflops,"
                    "vs_flashgen_dense\n")
            for row in rows:
                f.write(",".join(str(x) for x in row) + "\n")


if __name__ == "__main__":
    main()
