#!/usr/bin/env python3
"""Backward-attention benchmark: flashgen's backward (through its C ABI, loaded with ctypes; atomic and
deterministic dQ strategies) against the backward of PyTorch SDPA's FlashAttention-2 and cuDNN backends,
in one process, on the same tensors, over the standard grid of shared/ANCHORS.md. Writes a CSV and prints a
markdown table (the last thing printed).

Run on a GPU machine:  python3 bench/bench_bwd.py --lib build/libflashgen.so [--quick]
"""

import argparse
import ctypes
import datetime
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_fwd import (FLASHGEN_BFLOAT16, FLASHGEN_FLOAT16, FLASHGEN_MASK_CAUSAL, FLASHGEN_MASK_NONE,  # noqa: E402
                       REPO_ROOT, Bench, FlashgenAttentionOptions, FlashgenTensor, find_library, fmt, slug,
                       tensor_struct, write_csv)

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
            "torch.randn (dout too). flashgen's out and lse come from its own forward. Each point: one untimed "
            "flashgen backward whose dq, dk, dv are checked against SDPA FLASH_ATTENTION's gradients "
            "(max |diff| / max |FA2| above the tolerance aborts flashgen's row). Then each implementation gets "
            "--warmup untimed calls and --samples timed ones, L2 flushed before each; the peers' timed call is "
            "torch.autograd.grad over a retained SDPA graph (their backward only). FLOPs = 2.5x the forward's "
            "(10 * batch * heads * seqlen^2 * head_dim, halved when causal). Memory: the peers' peak device "
            "memory allocated by one backward call beyond what was allocated before it; flashgen's is its "
            "workspace (its only allocation, from the stream-ordered pool)."
        ),
    )
    parser.add_argument("--lib", default="build/libflashgen.so", help="path of libflashgen.so (default: %(default)s)")
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


def load_flashgen(path):
    lib = ctypes.CDLL(path)
    tensor_p = ctypes.POINTER(FlashgenTensor)
    options_p = ctypes.POINTER(FlashgenAttentionOptions)
    lib.flashgen_attention_forward.argtypes = [tensor_p] * 4 + [ctypes.c_void_p, options_p, ctypes.c_void_p]
    lib.flashgen_attention_forward.restype = ctypes.c_int
    lib.flashgen_attention_backward.argtypes = ([tensor_p] * 5 + [ctypes.c_void_p] + [tensor_p] * 3 +
                                                [options_p, ctypes.c_void_p])
    lib.flashgen_attention_backward.restype = ctypes.c_int
    lib.flashgen_last_error.restype = ctypes.c_char_p
    lib.flashgen_version.restype = ctypes.c_char_p
    return lib


def make_backward_call(lib, torch, tensors, lse, causal, deterministic, dtype_code):
    """tensors: q, k, v, out, dout, dq, dk, dv (BSHD). Runs on torch's current stream; raises on failure."""
    structs = [tensor_struct(t, dtype_code) for t in tensors]
    refs = [ctypes.byref(s) for s in structs]
    options = FlashgenAttentionOptions(0.0, FLASHGEN_MASK_CAUSAL if causal else FLASHGEN_MASK_NONE,
                                       1 if deterministic else 0)
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    lse_ptr = ctypes.c_void_p(lse.data_ptr())

    def call():
        status = lib.flashgen_attention_backward(refs[0], refs[1], refs[2], refs[3], refs[4], lse_ptr, refs[5],
                                                 refs[6], refs[7], ctypes.byref(options), stream)
        if status != 0:
            raise RuntimeError(f"flashgen_attention_backward returned {status}: "
                               f"{lib.flashgen_last_error().decode(errors='replace')}")

    call.keepalive = (structs, options)
    return call


def run_forward(lib, torch, q, k, v, out, lse, causal, dtype_code):
    structs = [tensor_struct(t, dtype_code) for t in (q, k, v, out)]
    options = FlashgenAttentionOptions(0.0, FLASHGEN_MASK_CAUSAL if causal else FLASHGEN_MASK_NONE, 0)
    status = lib.flashgen_attention_forward(*[ctypes.byref(s) for s in structs], ctypes.c_void_p(lse.data_ptr()),
                                            ctypes.byref(options),
                                            ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
    if status != 0:
        raise RuntimeError(f"flashgen_attention_forward: {lib.flashgen_last_error().decode(errors='replace')}")


def workspace_mb(batch, heads, seqlen, head_dim, deterministic):
    rows = batch * heads * seqlen
    return 4.0 * rows * (1 if deterministic else 1 + head_dim) / 2**20


def main():
    args = parse_args()
    lib_path = find_library(args.lib)
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if not torch.cuda.is_available():
        sys.exit("error: no CUDA device visible to torch")
    torch.manual_seed(args.seed)
    lib = load_flashgen(lib_path)
    device_name = torch.cuda.get_device_name()
    today = datetime.date.today().isoformat()
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    cudnn_version = f"{cudnn // 10000}.{cudnn // 100 % 100}.{cudnn % 100}" if cudnn else ""
    meta = {"device": device_name, "date": today, "torch_version": torch.__version__,
            "cuda_version": torch.version.cuda or "", "cudnn_version": cudnn_version,
            "flashgen_version": lib.flashgen_version().decode()}
    out_path = args.out or os.path.join(REPO_ROOT, "bench", "results", f"bwd_{slug(device_name)}_{today}.csv")
    print(f"# {device_name}, torch {meta['torch_version']}, cuDNN {cudnn_version}, flashgen "
          f"{meta['flashgen_version']}", flush=True)
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
                    label = f"{dtype_name} causal={'on' if causal else 'off'} d={head_dim} seqlen={seqlen}"
                    flops = 10.0 * batch * heads * seqlen * seqlen * head_dim / (2.0 if causal else 1.0)
                    row = dict(meta, dtype=dtype_name, causal=int(causal), head_dim=head_dim, batch=batch,
                               seqlen=seqlen, heads=heads,
                               flashgen_workspace_mb=workspace_mb(batch, heads, seqlen, head_dim, False),
                               flashgen_det_workspace_mb=workspace_mb(batch, heads, seqlen, head_dim, True))

                    def tflops(ms):
                        return None if ms is None else flops / (ms * 1e-3) / 1e12

                    def randn():
                        return torch.randn(batch, seqlen, heads, head_dim, dtype=torch_dtype, device="cuda")

                    q, k, v, dout = randn(), randn(), randn(), randn()
                    out = torch.empty_like(q)
                    lse = torch.empty(batch, heads, seqlen, dtype=torch.float32, device="cuda")
                    grads = {name: torch.full_like(q, float("nan")) for name in ("dq", "dk", "dv")}
                    error = None
                    try:
                        run_forward(lib, torch, q, k, v, out, lse, causal, dtype_code)
                        calls = {det: make_backward_call(lib, torch, (q, k, v, out, dout, grads["dq"], grads["dk"],
                                                                      grads["dv"]), lse, causal, det, dtype_code)
                                 for det in (False, True)}
                        start = time.perf_counter()
                        calls[False]()
                        torch.cuda.synchronize()
                        first_s = time.perf_counter() - start
                        # FA2's gradients as the reference.
                        qr, kr, vr = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
                        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                            o = F.scaled_dot_product_attention(qr, kr, vr, is_causal=causal)
                        ref = torch.autograd.grad(o, (qr, kr, vr), dout.transpose(1, 2))
                        worst = 0.0
                        for name, r in zip(("dq", "dk", "dv"), ref):
                            r = r.transpose(1, 2).float()
                            worst = max(worst, ((grads[name].float() - r).abs().max() / r.abs().max()).item())
                        del ref, o, qr, kr, vr
                        row["max_rel_diff"] = worst
                        print(f"  [{label}] first backward {first_s:.2f} s, max rel diff vs FA2 {worst:.3g}",
                              flush=True)
                        if not worst <= tolerance:
                            error = f"max |flashgen - FA2| / max |FA2| = {worst:.3g} > {tolerance:g}"
                    except Exception as exc:  # noqa: BLE001 - a failing point must not end the run
                        error = str(exc).strip().replace("\n", " | ")
                    if error is None:
                        median, p10, p90 = bench.time_ms(calls[False])
                        row.update(flashgen_ms=median, flashgen_ms_p10=p10, flashgen_ms_p90=p90,
                                   flashgen_tflops=tflops(median))
                        median, _, _ = bench.time_ms(calls[True])
                        row.update(flashgen_det_ms=median, flashgen_det_tflops=tflops(median))
                    else:
                        failures += 1
                        print(f"ERROR [{label}]: {error}", file=sys.stderr, flush=True)
                    row["error"] = error or ""

                    for name, backend in (("fa2", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                        try:
                            qp, kp, vp = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
                            with sdpa_kernel([backend]):
                                o = F.scaled_dot_product_attention(qp, kp, vp, is_causal=causal)
                            do = dout.transpose(1, 2)

                            def call():
                                torch.autograd.grad(o, (qp, kp, vp), do, retain_graph=True)

                            torch.cuda.synchronize()
                            base = torch.cuda.memory_allocated()
                            torch.cuda.reset_peak_memory_stats()
                            call()
                            torch.cuda.synchronize()
                            row[f"{name}_peak_mb"] = (torch.cuda.max_memory_allocated() - base) / 2**20
                            median, _, _ = bench.time_ms(call)
                            row[f"{name}_ms"] = median
                            row[f"{name}_tflops"] = tflops(median)
                            del o, qp, kp, vp
                        except Exception as exc:  # noqa: BLE001 - an unavailable peer gets empty cells
                            print(f"  [{label}] {name} unavailable: {str(exc).splitlines()[0][:200]}", flush=True)
                    for name in ("fa2", "cudnn"):
                        ours, theirs = row.get("flashgen_tflops"), row.get(f"{name}_tflops")
                        row[f"ratio_vs_{name}"] = ours / theirs if ours and theirs else None
                    print(f"  [{label}] flashgen {fmt(row.get('flashgen_tflops'))} (deterministic "
                          f"{fmt(row.get('flashgen_det_tflops'))}) TFLOP/s, FA2 {fmt(row.get('fa2_tflops'))}, "
                          f"cuDNN {fmt(row.get('cudnn_tflops'))}", flush=True)
                    rows.append(row)
                    del q, k, v, dout, out, lse, grads
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
              f"{fmt(r['flashgen_workspace_mb'])} ({fmt(r['flashgen_det_workspace_mb'])}) | "
              f"{fmt(r.get('fa2_peak_mb'))} / {fmt(r.get('cudnn_peak_mb'))} |")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
