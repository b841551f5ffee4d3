#!/usr/bin/env python3
"""Forward-attention benchmark: flashgen (through its C ABI, loaded with ctypes) against PyTorch SDPA's
FlashAttention-2 and cuDNN backends, in one process, on the same tensors, over the standard grid of
shared/ANCHORS.md. Writes a CSV and prints a markdown table (the last thing printed).

Run on a GPU machine:  python3 bench/bench_fwd.py --lib build/libflashgen.so [--quick]
"""

import argparse
import ctypes
import csv
import datetime
import math
import os
import re
import statistics
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# flashgen.h, mirrored for ctypes. C enums are int on every ABI flashgen targets.
FLASHGEN_FLOAT16 = 0
FLASHGEN_BFLOAT16 = 1
FLASHGEN_MASK_NONE = 0
FLASHGEN_MASK_CAUSAL = 1


class FlashgenTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),              # device pointer, 16-byte aligned
        ("dtype", ctypes.c_int),                # flashgen_dtype
        ("shape", ctypes.c_int64 * 4),          # [batch, seqlen, heads, head_dim]
        ("stride", ctypes.c_int64 * 4),         # elements; stride[3] == 1
    ]


class FlashgenAttentionOptions(ctypes.Structure):
    _fields_ = [
        ("softmax_scale", ctypes.c_float),      # <= 0: 1/sqrt(head_dim)
        ("mask", ctypes.c_int),                 # flashgen_mask
        ("deterministic", ctypes.c_int),        # backward only
    ]


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
            "events after writing a --flush-mb buffer to flush L2. FLOPs = 4 * batch * heads * seqlen^2 * "
            "head_dim, halved when causal. A peer that raises for a point leaves its cells empty. "
            "FLASHGEN_CACHE_DIR (read by the library) chooses the kernel cache."
        ),
    )
    parser.add_argument("--lib", default="build/libflashgen.so",
                        help="path of libflashgen.so (relative paths are tried from the current directory, "
                             "then from the repository root; default: %(default)s)")
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


def find_library(path):
    candidates = [path] if os.path.isabs(path) else [os.path.abspath(path), os.path.join(REPO_ROOT, path)]
    for candidate in candidates:
        if os.path.exists(candidate):
            return candidate
    sys.exit(f"error: libflashgen not found (tried {', '.join(candidates)}); build it or pass --lib")


def load_flashgen(path):
    lib = ctypes.CDLL(path)
    tensor_p = ctypes.POINTER(FlashgenTensor)
    lib.flashgen_attention_forward.argtypes = [tensor_p, tensor_p, tensor_p, tensor_p, ctypes.c_void_p,
                                               ctypes.POINTER(FlashgenAttentionOptions), ctypes.c_void_p]
    lib.flashgen_attention_forward.restype = ctypes.c_int
    lib.flashgen_last_error.argtypes = []
    lib.flashgen_last_error.restype = ctypes.c_char_p
    lib.flashgen_version.argtypes = []
    lib.flashgen_version.restype = ctypes.c_char_p
    return lib


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
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        times = sorted(start.elapsed_time(end) for start, end in zip(starts, ends))
        return statistics.median(times), percentile(times, 0.10), percentile(times, 0.90)


def tensor_struct(t, dtype_code):
    """flashgen_tensor over a torch tensor's [batch, seqlen, heads, head_dim] view."""
    s = FlashgenTensor()
    s.data = t.data_ptr()
    s.dtype = dtype_code
    s.shape = (ctypes.c_int64 * 4)(*t.shape)
    s.stride = (ctypes.c_int64 * 4)(*t.stride())
    return s


def make_flashgen_call(lib, torch, q, k, v, out, causal, dtype_code):
    """A zero-argument callable that runs flashgen on the current torch stream; raises on a non-zero status."""
    structs = [tensor_struct(t, dtype_code) for t in (q, k, v, out)]
    refs = [ctypes.byref(s) for s in structs]
    options = FlashgenAttentionOptions(0.0, FLASHGEN_MASK_CAUSAL if causal else FLASHGEN_MASK_NONE, 0)
    options_ref = ctypes.byref(options)
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    forward = lib.flashgen_attention_forward

    def call():
        status = forward(refs[0], refs[1], refs[2], refs[3], None, options_ref, stream)
        if status != 0:
            raise RuntimeError(f"flashgen_attention_forward returned {status}: "
                               f"{lib.flashgen_last_error().decode(errors='replace')}")

    call.keepalive = (structs, options)  # the structs must outlive every call
    return call


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
    lib_path = find_library(args.lib)

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if not torch.cuda.is_available():
        sys.exit("error: no CUDA device visible to torch")
    torch.manual_seed(args.seed)
    torch.cuda.init()
    lib = load_flashgen(lib_path)

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
        "flashgen_version": lib.flashgen_version().decode(),
    }
    out_path = args.out or os.path.join(REPO_ROOT, "bench", "results", f"fwd_{slug(device_name)}_{today}.csv")
    print(f"# {device_name}, torch {meta['torch_version']}, CUDA {meta['cuda_version']}, cuDNN {cudnn_version}, "
          f"flashgen {meta['flashgen_version']} ({lib_path})", flush=True)

    torch_dtypes = {"fp16": (torch.float16, FLASHGEN_FLOAT16), "bf16": (torch.bfloat16, FLASHGEN_BFLOAT16)}
    bench = Bench(args, torch)
    rows = []
    failures = 0

    for dtype_name in args.dtypes:
        torch_dtype, dtype_code = torch_dtypes[dtype_name]
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
                    out = torch.full_like(q, float("nan"))  # anything flashgen leaves unwritten shows up
                    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))

                    def sdpa(backend):
                        def call():
                            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                        return backend, call

                    peers = {"fa2": sdpa(SDPBackend.FLASH_ATTENTION), "cudnn": sdpa(SDPBackend.CUDNN_ATTENTION)}
                    error = None
                    flashgen_call = None
                    max_diff = None

                    # flashgen's first call (compile or cache load, untimed) and its check against FA2.
                    try:
                        flashgen_call = make_flashgen_call(lib, torch, q, k, v, out, causal, dtype_code)
                        start = time.perf_counter()
                        flashgen_call()
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
                        del reference
                        print(f"  [{label}] first flashgen call {first_call_s:.2f} s, max |flashgen - ref| = "
                              f"{max_diff:.3g}", flush=True)
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
                    del q, k, v, out, qt, kt, vt, flashgen_call, peers
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
