#!/usr/bin/env python3
"""Backward-attention benchmark: flashgen's backward (through flashgen.torch, the Python package under python/;
atomic and deterministic dQ strategies) against the backward of PyTorch SDPA's FlashAttention-2 and cuDNN
backends, in one process, on the same tensors, over the standard grid (batch * seqlen = 16384, heads * head_dim
= 2048). Every
implementation is timed the same way: torch.autograd.grad over a retained graph of its forward. Writes a CSV
and prints a markdown table (the last thing printed).

Run on a GPU machine:  python3 bench/bench_bwd.py [--lib build/libflashgen.so] [--quick]
"""

import argparse
import datetime
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_fwd import REPO_ROOT, Bench, fmt, import_flashgen_torch, slug, write_csv  # noqa: E402

CSV_COLUMNS = [
    "device", "date", "torch_version", "cuda_version", "cudnn_version", "flashgen_version",
    "dtype", "causal", "head_dim", "batch", "seqlen", "heads",
    "flashgen_ms", "flashgen_ms_p10", "flashgen_ms_p90", "flashgen_tflops",
    "flashgen_det_ms", "flashgen_det_tflops",
    "fa2_ms", "fa2_tflops", "cudnn_ms", "cudnn_tflops",
    "ratio_vs_fa2", "ratio_vs_cudnn",
    "flashgen_workspace_mb", "flashgen_det_workspace_mb", "fa2_peak_mb", "cudnn_peak_mb",
    "max_rel_diff", "error",
]

DEFAULT_SEQLENS = [512, 1024, 2048, 4096, 8192, 16384]
QUICK_SEQLENS = [1024, 4096]
DEFAULT_TOLERANCE = {"fp16": 2e-2, "bf16": 5e-2}


def parse_args():
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "Grid: batch = tokens / seqlen, heads = hidden / head_dim, causal off and on, BSHD tensors from "
            "torch.randn (dout too). Each point: one untimed flashgen forward and backward (compile or cache "
            "load) whose dq, dk, dv are checked against SDPA FLASH_ATTENTION's gradients (max |diff| / max |FA2| "
            "above the tolerance aborts flashgen's row). Then each implementation gets --warmup untimed calls and "
            "--samples timed ones, L2 flushed before each; the timed call is torch.autograd.grad over a retained "
            "graph of that implementation's forward (its backward only). FLOPs = 2.5x the forward's "
            "(10 * batch * heads * seqlen^2 * head_dim, halved when causal). Memory: the peers' peak device "
            "memory allocated by one backward call beyond what was allocated before it; flashgen's is the "
            "workspace its explain() reports (a torch allocation, freed after the call)."
        ),
    )
    parser.add_argument("--lib", default=None,
                        help="path of libflashgen.so, passed to the package as FLASHGEN_LIBRARY (default: the "
                             "package's own search: $FLASHGEN_LIBRARY, then build/libflashgen.so of this checkout)")
    parser.add_argument("--out", default=None,
                        help="CSV path (default: bench/results/bwd_<device-slug>_<YYYY-MM-DD>.csv)")
    parser.add_argument("--dtypes", default="fp16", help="comma-separated from fp16,bf16 (default: %(default)s)")
    parser.add_argument("--head-dims", default="64,128", help="comma-separated head dims (default: %(default)s)")
    parser.add_argument("--seqlens", default=None, help="comma-separated seqlens (default: 512..16384)")
    parser.add_argument("--quick", action="store_true", help="seqlens 1024 and 4096 only")
    parser.add_argument("--causal", default="off,on", help="comma-separated from off,on (default: %(default)s)")
    parser.add_argument("--tokens", type=int, default=16384, help="batch * seqlen (default: %(default)s)")
    parser.add_argument("--hidden", type=int, default=2048, help="heads * head_dim (default: %(default)s)")
    parser.add_argument("--samples", type=int, default=20, help="timed samples (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls before sampling (default: %(default)s)")
    parser.add_argument("--flush-mb", type=int, default=256, help="L2 flush buffer size (default: %(default)s)")
    parser.add_argument("--tol", type=float, default=None, help="max relative gradient difference vs FA2")
    parser.add_argument("--seed", type=int, default=0, help="torch.manual_seed (default: %(default)s)")
    args = parser.parse_args()
    args.dtypes = [d for d in args.dtypes.split(",") if d]
    for d in args.dtypes:
        if d not in ("fp16", "bf16"):
            parser.error(f"--dtypes: unknown dtype {d!r}")
    try:
        args.head_dims = [int(x) for x in args.head_dims.split(",") if x]
        args.seqlens = (QUICK_SEQLENS if args.quick else
                        DEFAULT_SEQLENS if args.seqlens is None else [int(x) for x in args.seqlens.split(",") if x])
    except ValueError:
        parser.error("--head-dims and --seqlens take comma-separated integers")
    args.causal = [c == "on" for c in args.causal.split(",") if c]
    return args


def retained_backward(torch, forward, q, k, v, dout):
    """A call that runs only the backward of forward(q, k, v) (fresh leaves, graph retained) for dout, and the
    leaves, whose gradients the call returns."""
    leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
    out = forward(*leaves)

    def call():
        return torch.autograd.grad(out, leaves, dout, retain_graph=True)

    return call


class Flex:
    """FlexAttention as the variant benchmarks run it: flex_attention compiled once for their whole grid. Each shape
    and mask is a new specialization, and past dynamo's default limit of 8 it would run eagerly (the unfused
    reference, which materializes the scores), so the limit is raised."""

    def __init__(self, torch):
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        torch._dynamo.config.cache_size_limit = 256
        self.compiled = torch.compile(flex_attention, dynamic=False)
        self.flex_attention = flex_attention  # for a caller that compiles it inside a larger function
        self.create_block_mask = create_block_mask

    def block_mask(self, visible, seqlen):
        """The block mask of visible(b, h, q_idx, kv_idx) over seqlen queries and keys, for every batch and head."""
        return self.create_block_mask(visible, None, None, seqlen, seqlen)

    def call(self, score_mod=None, block_mask=None):
        """A forward(q, k, v) on bshd tensors, as the flashgen calls beside it take them."""
        def forward(q, k, v):
            out = self.compiled(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), score_mod=score_mod,
                                block_mask=block_mask)
            return out.transpose(1, 2)
        return forward


def time_calls(bench, torch, calls, q, k, v, dout, flops, result, label):
    """Times each of calls (name -> forward(q, k, v)) forward and backward (alone, on a retained graph) into
    result's <name>_fwd_ms, <name>_fwd_tflops and <name>_bwd_tflops (flops: the forward's; the backward's are
    2.5x). A call that cannot run the shape is reported on stderr and recorded as NaN."""
    for name, call in calls.items():
        try:
            fwd_ms = bench.time_ms(lambda: call(q, k, v))[0]
            bwd_ms = bench.time_ms(retained_backward(torch, call, q, k, v, dout))[0]
        except Exception as error:  # a peer that cannot run this shape: recorded, not fatal
            print(f"{name} {label}: {error}", file=sys.stderr)
            fwd_ms = bwd_ms = float("nan")
        result[f"{name}_fwd_ms"] = round(fwd_ms, 4)
        result[f"{name}_fwd_tflops"] = round(flops / fwd_ms / 1e9, 1)
        result[f"{name}_bwd_tflops"] = round(2.5 * flops / bwd_ms / 1e9, 1)


def main():
    args = parse_args()
    flashgen, flashgen_torch = import_flashgen_torch(args.lib)
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if not torch.cuda.is_available():
        sys.exit("error: no CUDA device visible to torch")
    torch.manual_seed(args.seed)
    device_name = torch.cuda.get_device_name()
    today = datetime.date.today().isoformat()
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    cudnn_version = f"{cudnn // 10000}.{cudnn // 100 % 100}.{cudnn % 100}" if cudnn else ""
    meta = {"device": device_name, "date": today, "torch_version": torch.__version__,
            "cuda_version": torch.version.cuda or "", "cudnn_version": cudnn_version,
            "flashgen_version": flashgen.version()}
    out_path = args.out or os.path.join(REPO_ROOT, "bench", "results", f"bwd_{slug(device_name)}_{today}.csv")
    print(f"# {device_name}, torch {meta['torch_version']}, cuDNN {cudnn_version}, flashgen "
          f"{meta['flashgen_version']} ({flashgen.library_path()})", flush=True)
    torch_dtypes = {"fp16": torch.float16, "bf16": torch.bfloat16}
    bench = Bench(args, torch)
    rows = []
    failures = 0

    for dtype_name in args.dtypes:
        torch_dtype = torch_dtypes[dtype_name]
        tolerance = args.tol if args.tol is not None else DEFAULT_TOLERANCE[dtype_name]
        for head_dim in args.head_dims:
            for causal in args.causal:
                for seqlen in args.seqlens:
                    batch = max(1, args.tokens // seqlen)
                    heads = max(1, args.hidden // head_dim)
                    label = f"{dtype_name} causal={'on' if causal else 'off'} d={head_dim} seqlen={seqlen}"
                    flops = 10.0 * batch * heads * seqlen * seqlen * head_dim / (2.0 if causal else 1.0)
                    row = dict(meta, dtype=dtype_name, causal=int(causal), head_dim=head_dim, batch=batch,
                               seqlen=seqlen, heads=heads)

                    def tflops(ms):
                        return None if ms is None else flops / (ms * 1e-3) / 1e12

                    def randn():
                        return torch.randn(batch, seqlen, heads, head_dim, dtype=torch_dtype, device="cuda")

                    # BSHD tensors for flashgen; SDPA reads their [b, h, s, d] views.
                    q, k, v, dout = randn(), randn(), randn(), randn()

                    def flashgen_forward(deterministic):
                        return lambda *qkv: flashgen_torch.attention(*qkv, causal=causal, deterministic=deterministic)

                    def sdpa_forward(backend):
                        def forward(*qkv):
                            with sdpa_kernel([backend]):
                                return F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in qkv),
                                                                      is_causal=causal).transpose(1, 2)
                        return forward

                    error = None
                    calls = {}
                    try:
                        for deterministic in (False, True):
                            name = "flashgen_det" if deterministic else "flashgen"
                            chosen = flashgen_torch.explain(q, k, v, causal=causal, deterministic=deterministic)
                            row[f"{name}_workspace_mb"] = chosen["backward"]["workspace_bytes"] / 2**20
                            print(f"  [{label}] {name}: {chosen['backward']['config']} "
                                  f"({chosen['backward']['reason']})", flush=True)
                            calls[name] = retained_backward(torch, flashgen_forward(deterministic), q, k, v, dout)
                        # Freed NaNs of the gradients' sizes: the caching allocator hands these blocks to the first
                        # backward's outputs, so anything its kernels leave unwritten fails the check.
                        poison = [torch.full_like(q, float("nan")) for _ in range(3)]
                        del poison
                        start = time.perf_counter()
                        grads = calls["flashgen"]()
                        torch.cuda.synchronize()
                        first_s = time.perf_counter() - start
                        # FA2's gradients as the reference.
                        reference = retained_backward(torch, sdpa_forward(SDPBackend.FLASH_ATTENTION), q, k, v, dout)()
                        ratios = [((got.float() - want.float()).abs().max() / want.float().abs().max()).item()
                                  for got, want in zip(grads, reference)]
                        worst = float("nan") if any(r != r for r in ratios) else max(ratios)  # NaN must fail
                        del grads, reference
                        row["max_rel_diff"] = worst
                        print(f"  [{label}] first backward {first_s:.2f} s, max rel diff vs FA2 {worst:.3g}",
                              flush=True)
                        if not worst <= tolerance:  # NaN fails too
                            error = f"max |flashgen - FA2| / max |FA2| = {worst:.3g} > {tolerance:g}"
                    except Exception as exc:  # noqa: BLE001 - a failing point must not end the run
                        error = str(exc).strip().replace("\n", " | ")
                    if error is None:
                        median, p10, p90 = bench.time_ms(calls["flashgen"])
                        row.update(flashgen_ms=median, flashgen_ms_p10=p10, flashgen_ms_p90=p90,
                                   flashgen_tflops=tflops(median))
                        median, _, _ = bench.time_ms(calls["flashgen_det"])
                        row.update(flashgen_det_ms=median, flashgen_det_tflops=tflops(median))
                    else:
                        failures += 1
                        print(f"ERROR [{label}]: {error}", file=sys.stderr, flush=True)
                    row["error"] = error or ""
                    del calls

                    for name, backend in (("fa2", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                        try:
                            call = retained_backward(torch, sdpa_forward(backend), q, k, v, dout)
                            torch.cuda.synchronize()
                            base = torch.cuda.memory_allocated()
                            torch.cuda.reset_peak_memory_stats()
                            call()
                            torch.cuda.synchronize()
                            row[f"{name}_peak_mb"] = (torch.cuda.max_memory_allocated() - base) / 2**20
                            median, _, _ = bench.time_ms(call)
                            row[f"{name}_ms"] = median
                            row[f"{name}_tflops"] = tflops(median)
                            del call
                        except Exception as exc:  # noqa: BLE001 - an unavailable peer gets empty cells
                            print(f"  [{label}] {name} unavailable: {str(exc).splitlines()[0][:200]}", flush=True)
                    for name in ("fa2", "cudnn"):
                        ours, theirs = row.get("flashgen_tflops"), row.get(f"{name}_tflops")
                        row[f"ratio_vs_{name}"] = ours / theirs if ours and theirs else None
                    print(f"  [{label}] flashgen {fmt(row.get('flashgen_tflops'))} (deterministic "
                          f"{fmt(row.get('flashgen_det_tflops'))}) TFLOP/s, FA2 {fmt(row.get('fa2_tflops'))}, "
                          f"cuDNN {fmt(row.get('cudnn_tflops'))}", flush=True)
                    rows.append(row)
                    del q, k, v, dout
                    torch.cuda.empty_cache()

    write_csv(out_path, CSV_COLUMNS, rows)
    print(f"# wrote {out_path}")
    print()
    print(f"{device_name}, {today}, torch {meta['torch_version']}, cuDNN {cudnn_version}: backward TFLOP/s "
          f"(median of {args.samples}, L2 flushed)")
    print()
    print("| dtype | causal | d | seqlen | flashgen | flashgen det | FA2 | cuDNN | vs FA2 | vs cuDNN "
          "| workspace MB (det) | FA2 / cuDNN peak MB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['dtype']} | {'yes' if r['causal'] else 'no'} | {r['head_dim']} | {r['seqlen']} | "
              f"{fmt(r.get('flashgen_tflops'))} | {fmt(r.get('flashgen_det_tflops'))} | {fmt(r.get('fa2_tflops'))} | "
              f"{fmt(r.get('cudnn_tflops'))} | {fmt(r.get('ratio_vs_fa2'), 2)} | {fmt(r.get('ratio_vs_cudnn'), 2)} | "
              f"{fmt(r.get('flashgen_workspace_mb'))} ({fmt(r.get('flashgen_det_workspace_mb'))}) | "
              f"{fmt(r.get('fa2_peak_mb'))} / {fmt(r.get('cudnn_peak_mb'))} |")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
