#!/usr/bin/env python3
"""Forward-attention benchmark: flashgen (flashgen.torch.attention, the Python package under python/) against
PyTorch SDPA's FlashAttention-2 and cuDNN backends, in one process, on the same tensors, over the standard grid
(batch * seqlen = 16384, heads * head_dim = 2048). Writes a CSV and prints a markdown table (the last thing printed).

Run on a GPU machine:  python3 bench/bench_fwd.py [--lib build/libflashgen.so] [--quick]
"""

import argparse
import csv
import datetime
import math
import os
import re
import statistics
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


CSV_COLUMNS = [
    "device", "date", "torch_version", "cuda_version", "cudnn_version", "flashgen_version",
    "dtype", "causal", "head_dim", "batch", "seqlen", "heads",
    "flashgen_ms", "flashgen_ms_p10", "flashgen_ms_p90", "flashgen_tflops",
    "fa2_ms", "fa2_tflops", "cudnn_ms", "cudnn_tflops",
    "ratio_vs_fa2", "ratio_vs_cudnn", "max_abs_diff", "error",
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
            "torch.randn. Each (dtype, head_dim, causal, seqlen) point: one untimed flashgen call (it compiles "
            "the kernel or loads it from the cache) whose output is checked against SDPA's FLASH_ATTENTION "
            "output; a max |diff| above the tolerance aborts flashgen's row (error column filled, exit status 1). "
            "Then each implementation gets --warmup untimed calls and --samples timed ones, each timed with CUDA "
            "events after writing a --flush-mb buffer to flush L2 and a short GPU sleep that keeps the host ahead "
            "(so Python overhead is not timed). flashgen is called as a user would, flashgen.torch.attention(q, k, "
            "v, causal=...), its output allocated per call like SDPA's. FLOPs = 4 * batch * heads * seqlen^2 * "
            "head_dim, halved when causal. A peer that raises for a point leaves its cells empty. "
            "FLASHGEN_CACHE_DIR (read by the library) chooses the kernel cache."
        ),
    )
    parser.add_argument("--lib", default=None,
                        help="path of libflashgen.so, passed to the package as FLASHGEN_LIBRARY (relative paths are "
                             "tried from the current directory, then from the repository root; default: the "
                             "package's own search: $FLASHGEN_LIBRARY, then build/libflashgen.so of this checkout)")
    parser.add_argument("--out", default=None,
                        help="CSV path (default: bench/results/fwd_<device-slug>_<YYYY-MM-DD>.csv in the repository)")
    parser.add_argument("--dtypes", default="fp16",
                        help="comma-separated dtypes from fp16,bf16 (default: %(default)s)")
    parser.add_argument("--head-dims", default="64,128",
                        help="comma-separated head dims, e.g. 64,128,256 (default: %(default)s)")
    parser.add_argument("--seqlens", default=None,
                        help="comma-separated seqlens (default: 512,1024,2048,4096,8192,16384)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: seqlens 1024 and 4096 only (overrides --seqlens)")
    parser.add_argument("--causal", default="off,on",
                        help="comma-separated causal settings from off,on (default: %(default)s)")
    parser.add_argument("--tokens", type=int, default=16384,
                        help="batch * seqlen of every point (default: %(default)s)")
    parser.add_argument("--hidden", type=int, default=2048,
                        help="heads * head_dim of every point (default: %(default)s)")
    parser.add_argument("--samples", type=int, default=30, help="timed samples per implementation (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed calls before sampling (default: %(default)s)")
    parser.add_argument("--flush-mb", type=int, default=256,
                        help="size of the buffer written before each sample to flush L2 (default: %(default)s)")
    parser.add_argument("--tol", type=float, default=None,
                        help="max |flashgen - FA2| allowed before timing (default: 2e-2 for fp16, 5e-2 for bf16)")
    parser.add_argument("--seed", type=int, default=0, help="torch.manual_seed for the inputs (default: %(default)s)")
    parser.add_argument("--no-peers", action="store_true",
                        help="time flashgen only (the correctness check still uses FA2 when it runs)")
    args = parser.parse_args()

    def int_list(text, name):
        try:
            values = [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            parser.error(f"{name}: expected comma-separated integers, got {text!r}")
        if not values or any(v <= 0 for v in values):
            parser.error(f"{name}: expected positive integers, got {text!r}")
        return values

    args.dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    for d in args.dtypes:
        if d not in ("fp16", "bf16"):
            parser.error(f"--dtypes: unknown dtype {d!r} (fp16, bf16)")
    args.head_dims = int_list(args.head_dims, "--head-dims")
    if args.quick:
        args.seqlens = list(QUICK_SEQLENS)
    elif args.seqlens is None:
        args.seqlens = list(DEFAULT_SEQLENS)
    else:
        args.seqlens = int_list(args.seqlens, "--seqlens")
    causal = [c.strip() for c in args.causal.split(",") if c.strip()]
    for c in causal:
        if c not in ("off", "on"):
            parser.error(f"--causal: expected off and/or on, got {c!r}")
    args.causal = [c == "on" for c in causal]
    if args.samples < 1:
        parser.error("--samples must be >= 1")
    return args


def import_flashgen_torch(lib):
    """flashgen.torch from this checkout's python/ (or an installed flashgen), with --lib as FLASHGEN_LIBRARY."""
    if lib is not None:
        candidates = [lib] if os.path.isabs(lib) else [os.path.abspath(lib), os.path.join(REPO_ROOT, lib)]
        found = next((c for c in candidates if os.path.exists(c)), None)
        if found is None:
            sys.exit(f"error: libflashgen not found (tried {', '.join(candidates)}); build it or fix --lib")
        os.environ["FLASHGEN_LIBRARY"] = found
    sys.path.insert(0, os.path.join(REPO_ROOT, "python"))
    import flashgen
    import flashgen.torch
    return flashgen, flashgen.torch


def slug(text):
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def percentile(sorted_values, fraction):
    """Linear interpolation between closest ranks, as numpy.percentile does by default."""
    if len(sorted_values) == 1:
        return sorted_values[0]
    position = fraction * (len(sorted_values) - 1)
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


# GPU cycles of torch.cuda._sleep queued after each L2 flush (about 0.25 ms): the host queues the start event and
# the call while the GPU still sleeps, so the Python and dispatch time of a call never shows up as an idle gap
# between the events, for flashgen and the peers alike.
HOST_LEAD_CYCLES = 500_000


class Bench:
    def __init__(self, args, torch):
        self.args = args
        self.torch = torch
        # Writing this buffer evicts the inputs from L2 (50 MB on H100/H200) before every sample.
        self.flush_buffer = torch.empty(args.flush_mb * 1024 * 1024, dtype=torch.uint8, device="cuda")

    def time_ms(self, fn):
        """Median, p10 and p90 of fn's GPU time in ms over args.samples L2-cold samples."""
        torch = self.torch
        for _ in range(self.args.warmup):
            fn()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(self.args.samples)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(self.args.samples)]
        for start, end in zip(starts, ends):
            self.flush_buffer.zero_()
            torch.cuda._sleep(HOST_LEAD_CYCLES)
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        times = sorted(start.elapsed_time(end) for start, end in zip(starts, ends))
        return statistics.median(times), percentile(times, 0.10), percentile(times, 0.90)


def reference_slice(torch, q, k, v, causal):
    """fp32 attention of batch 0, heads 0..1, [1, s, 2, d]: the fallback check when FA2 cannot run."""
    qs, ks, vs = (t[:1, :, :2].transpose(1, 2).float() for t in (q, k, v))
    scores = (qs @ ks.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        s = q.shape[1]
        scores.masked_fill_(torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return (torch.softmax(scores, dim=-1) @ vs).transpose(1, 2)


def write_csv(path, columns, rows):
    """Rows (dicts) as CSV: floats with 6 significant digits, missing cells empty."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({c: ("" if row.get(c) is None else
                                 f"{row[c]:.6g}" if isinstance(row.get(c), float) else row[c])
                             for c in columns})


def fmt(value, digits=1):
    return "" if value is None else f"{value:.{digits}f}"


def main():
    args = parse_args()
    flashgen, flashgen_torch = import_flashgen_torch(args.lib)

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if not torch.cuda.is_available():
        sys.exit("error: no CUDA device visible to torch")
    torch.manual_seed(args.seed)
    torch.cuda.init()

    device_name = torch.cuda.get_device_name()
    today = datetime.date.today().isoformat()
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    cudnn_version = f"{cudnn // 10000}.{cudnn // 100 % 100}.{cudnn % 100}" if cudnn else ""
    meta = {
        "device": device_name,
        "date": today,
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda or "",
        "cudnn_version": cudnn_version,
        "flashgen_version": flashgen.version(),
    }
    out_path = args.out or os.path.join(REPO_ROOT, "bench", "results", f"fwd_{slug(device_name)}_{today}.csv")
    print(f"# {device_name}, torch {meta['torch_version']}, CUDA {meta['cuda_version']}, cuDNN {cudnn_version}, "
          f"flashgen {meta['flashgen_version']} ({flashgen.library_path()})", flush=True)

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
                    label = f"{dtype_name} causal={'on' if causal else 'off'} d={head_dim} seqlen={seqlen} " \
                            f"batch={batch} heads={heads}"
                    flops = 4.0 * batch * heads * seqlen * seqlen * head_dim / (2.0 if causal else 1.0)
                    row = dict(meta, dtype=dtype_name, causal=int(causal), head_dim=head_dim, batch=batch,
                               seqlen=seqlen, heads=heads)

                    def tflops(ms):
                        return None if ms is None else flops / (ms * 1e-3) / 1e12

                    # Same random-normal BSHD tensors for every implementation; SDPA reads [b, h, s, d] views.
                    q, k, v = (torch.randn(batch, seqlen, heads, head_dim, dtype=torch_dtype, device="cuda")
                               for _ in range(3))
                    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))

                    def sdpa(backend):
                        def call():
                            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                        return backend, call

                    peers = {"fa2": sdpa(SDPBackend.FLASH_ATTENTION), "cudnn": sdpa(SDPBackend.CUDNN_ATTENTION)}
                    error = None
                    max_diff = None

                    def flashgen_call():
                        return flashgen_torch.attention(q, k, v, causal=causal)

                    # flashgen's first call (compile or cache load, untimed) and its check against FA2.
                    try:
                        # Freed NaNs of out's size: the caching allocator hands this block to flashgen's out, so
                        # anything the kernel leaves unwritten shows up in the check.
                        poison = torch.full_like(q, float("nan"))
                        del poison
                        start = time.perf_counter()
                        out = flashgen_call()
                        torch.cuda.synchronize()
                        first_call_s = time.perf_counter() - start
                        reference = None
                        try:
                            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                                reference = peers["fa2"][1]().transpose(1, 2)
                            got = out
                        except Exception as exc:  # noqa: BLE001 - FA2 unavailable: check a slice in fp32
                            print(f"  [{label}] FA2 unavailable for the check ({exc}); using an fp32 slice",
                                  flush=True)
                            reference = reference_slice(torch, q, k, v, causal)
                            got = out[:1, :, :2].float()
                        max_diff = (got.float() - reference.float()).abs().max().item()
                        del reference, out, got
                        chosen = flashgen_torch.explain(q, k, v, causal=causal, backward=False)["forward"]
                        print(f"  [{label}] first flashgen call {first_call_s:.2f} s, max |flashgen - ref| = "
                              f"{max_diff:.3g}; config {chosen['config']} ({chosen['reason']})", flush=True)
                        if not (max_diff <= tolerance):  # NaN fails too
                            error = f"max |flashgen - FA2| = {max_diff:.3g} > {tolerance:g}"
                    except Exception as exc:  # noqa: BLE001 - a failing point must not end the run
                        error = str(exc).strip().replace("\n", " | ")
                    if error is not None:
                        failures += 1
                        print(f"ERROR [{label}]: {error}", file=sys.stderr, flush=True)
                    else:
                        median, p10, p90 = bench.time_ms(flashgen_call)
                        row.update(flashgen_ms=median, flashgen_ms_p10=p10, flashgen_ms_p90=p90,
                                   flashgen_tflops=tflops(median))
                    row.update(max_abs_diff=max_diff, error=error or "")

                    if not args.no_peers:
                        for name, (backend, call) in peers.items():
                            try:
                                with sdpa_kernel([backend]):
                                    median, _, _ = bench.time_ms(call)
                                row[f"{name}_ms"] = median
                                row[f"{name}_tflops"] = tflops(median)
                            except Exception as exc:  # noqa: BLE001 - an unavailable peer gets an empty cell
                                print(f"  [{label}] {name} unavailable: {str(exc).splitlines()[0][:200]}",
                                      flush=True)
                    for name in ("fa2", "cudnn"):
                        ours, theirs = row.get("flashgen_tflops"), row.get(f"{name}_tflops")
                        row[f"ratio_vs_{name}"] = ours / theirs if ours and theirs else None
                    print(f"  [{label}] flashgen {fmt(row.get('flashgen_tflops'))} TFLOP/s, "
                          f"FA2 {fmt(row.get('fa2_tflops'))}, cuDNN {fmt(row.get('cudnn_tflops'))}", flush=True)
                    rows.append(row)
                    del q, k, v, qt, kt, vt, flashgen_call, peers
                    torch.cuda.empty_cache()

    write_csv(out_path, CSV_COLUMNS, rows)
    print(f"# wrote {out_path}")
    if failures:
        print(f"# {failures} point(s) failed for flashgen; see the error column", file=sys.stderr)

    print()
    print(f"{device_name}, {meta['date']}, torch {meta['torch_version']}, cuDNN {cudnn_version}, "
          f"flashgen {meta['flashgen_version']}: forward TFLOP/s (median of {args.samples}, L2 flushed)")
    print()
    print("| dtype | causal | d | seqlen | batch x heads | flashgen ms (p10-p90) | flashgen | FA2 | cuDNN "
          "| vs FA2 | vs cuDNN | max diff |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        timing = (f"{r['flashgen_ms']:.3f} ({r['flashgen_ms_p10']:.3f}-{r['flashgen_ms_p90']:.3f})"
                  if r.get("flashgen_ms") is not None else f"error: {r['error'][:60]}")
        diff = "" if r.get("max_abs_diff") is None else f"{r['max_abs_diff']:.2g}"
        print(f"| {r['dtype']} | {'yes' if r['causal'] else 'no'} | {r['head_dim']} | {r['seqlen']} | "
              f"{r['batch']} x {r['heads']} | {timing} | {fmt(r.get('flashgen_tflops'))} | "
              f"{fmt(r.get('fa2_tflops'))} | {fmt(r.get('cudnn_tflops'))} | {fmt(r.get('ratio_vs_fa2'), 2)} | "
              f"{fmt(r.get('ratio_vs_cudnn'), 2)} | {diff} |")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
