#!/usr/bin/env python3
"""Where a backward call's time goes between its kernels: flashgen's C ABI called on torch's stream under
torch.profiler (CUDA activity), each call after an L2 flush. Per case, the medians over the profiled calls of the
call's span (the preprocess's start to the last kernel's end), the preprocess's and dkdv kernel's durations, the gap
between them, the convert kernel's duration and how far it runs past the dkdv kernel's end, and the share of the
span the row kernels add (preprocess, gap and the convert's part past dkdv). bf16, batch * seqlen = 16384,
heads * head_dim = 2048, the shipped or heuristic choice of config. Writes a CSV.

    python3 bench/bwd_call_profile.py --lib build/libflashgen.so [--calls 8] [--window 1024] [--out FILE]
"""

import argparse
import ctypes
import datetime
import statistics
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from ab_libraries import Library, Problem, mask_label

CASES = [(128, "none", 1024), (128, "none", 4096), (128, "none", 16384), (128, "causal", 1024),
         (128, "causal", 16384), (128, "window", 4096), (128, "window", 16384), (64, "none", 1024),
         (64, "none", 4096), (64, "causal", 1024)]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lib", required=True, help="libflashgen.so")
    parser.add_argument("--calls", type=int, default=8, help="profiled calls per case")
    parser.add_argument("--window", type=int, default=1024, help="the window cases' keys before the diagonal")
    parser.add_argument("--out")
    args = parser.parse_args()
    lib = Library(args.lib)
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    device = torch.cuda.get_device_name()
    date = datetime.date.today().isoformat()
    lines = ["device,date,torch,dtype,head_dim,mask,batch,seqlen,heads,call_span_us,preprocess_us,gap_us,dkdv_us,"
             "convert_us,convert_past_dkdv_us,row_kernels_share"]
    print("head_dim mask seqlen: span_us | preprocess_us gap_us dkdv_us convert_us convert_past_dkdv_us", flush=True)
    torch.manual_seed(0)
    for head_dim, mask, seqlen in CASES:
        batch, heads = 16384 // seqlen, 2048 // head_dim
        problem = Problem(torch.bfloat16, 1, head_dim, seqlen, stream)
        opts = lib.options(mask, False, 0.0, args.window)
        problem.forward(lib, opts)

        def backward():
            problem.backward(lib, opts)

        for _ in range(3):  # compile or load, choose
            backward()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(args.calls):
                flush.zero_()
                backward()
                torch.cuda.synchronize()
        kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                         key=lambda e: e.time_range.start)
        calls = []
        for e in kernels:  # a call: preprocess, dkdv, convert (the flush's kernel belongs to none)
            if "_preprocess" in e.name:
                calls.append({"preprocess": e.time_range})
            elif calls and "_dkdv" in e.name:
                calls[-1]["dkdv"] = e.time_range
            elif calls and "_convert" in e.name:
                calls[-1]["convert"] = e.time_range
        rows = []
        for c in calls:
            if len(c) != 3:
                continue
            p, d, v = c["preprocess"], c["dkdv"], c["convert"]
            rows.append((max(d.end, v.end) - p.start, p.end - p.start, d.start - p.end, d.end - d.start,
                         v.end - v.start, v.end - d.end))
        if not rows:
            raise RuntimeError(f"no call's three kernels found among {sorted({e.name for e in kernels})}")
        span, pre, gap, dkdv, convert, past = (statistics.median(r[i] for r in rows) for i in range(6))
        name = mask_label(mask, args.window)
        print(f"{head_dim} {name} {seqlen}: {span:.1f} | {pre:.1f} {gap:.1f} {dkdv:.1f} {convert:.1f} {past:.1f}",
              flush=True)
        lines.append(f"{device},{date},{torch.__version__},bf16,{head_dim},{name},{batch},{seqlen},{heads},{span:.1f},"
                     f"{pre:.1f},{gap:.1f},{dkdv:.1f},{convert:.1f},{past:.1f},{(pre + gap + past) / span:.3f}")
    if args.out:
        open(args.out, "w").write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
