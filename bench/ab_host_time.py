#!/usr/bin/env python3
"""Host time per call of two builds of libflashgen side by side: both libraries loaded into one process through their
C ABIs (ab_libraries.py's loader), each warm call of a small problem timed from entering the C function to its
return (the kernels queued), in rounds that take turns (A, B, A again); the stream is drained between rounds, outside
the timed calls. A again against A is the run-to-run noise. Writes a CSV.

    python3 bench/ab_host_time.py --a old/libflashgen.so --b new/libflashgen.so [--rounds 30] [--calls 200]
        [--shapes 1x128x1x64,16x1024x16x128] [--out FILE]

A shape is BATCHxSEQLENxHEADSxHEAD_DIM; each runs the forward and the backward, causal and not.
"""

import argparse
import ctypes
import datetime
import statistics
import sys
import time

import torch

from ab_libraries import Library, view


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--a", required=True, help="libflashgen.so of the build before")
    parser.add_argument("--b", required=True, help="libflashgen.so of the build after")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--calls", type=int, default=200, help="timed calls per library per round")
    parser.add_argument("--shapes", default="1x128x1x64,4x1024x16x64,16x1024x16x128")
    parser.add_argument("--out")
    args = parser.parse_args()
    a, b = Library(args.a), Library(args.b)
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    torch.manual_seed(0)
    rows = []
    for shape in args.shapes.split(","):
        batch, seqlen, heads, head_dim = (int(x) for x in shape.split("x"))
        q, k, v, dout = (torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16)
                         for _ in range(4))
        out, dq, dk, dv = (torch.empty_like(q) for _ in range(4))
        lse = torch.empty(batch, heads, seqlen, device="cuda", dtype=torch.float32)
        views = [view(t, 1) for t in (q, k, v, out)]
        grads = [view(t, 1) for t in (dout, dq, dk, dv)]
        lse_ptr = ctypes.c_void_p(lse.data_ptr())
        for mask in ("none", "causal"):
            for name in ("forward", "backward"):
                calls = {}
                for lib in (a, b):
                    opts = ctypes.byref(lib.options(mask, False, 0.0, 0))
                    fwd_args = [ctypes.byref(x) for x in views] + [lse_ptr, opts, stream]
                    bwd_args = ([ctypes.byref(x) for x in views] + [ctypes.byref(grads[0]), lse_ptr] +
                                [ctypes.byref(x) for x in grads[1:]] + [opts, stream])
                    fn = lib.lib.flashgen_attention_forward if name == "forward" else lib.lib.flashgen_attention_backward
                    fn_args = fwd_args if name == "forward" else bwd_args
                    lib.check(lib.lib.flashgen_attention_forward(*fwd_args), "forward")
                    lib.check(fn(*fn_args), name)  # compile or load, choose
                    calls[lib] = (fn, fn_args)
                torch.cuda.synchronize()
                samples = {"a": [], "b": [], "a2": []}
                for _ in range(args.rounds):
                    for key, lib in (("a", a), ("b", b), ("a2", a)):
                        fn, fn_args = calls[lib]
                        for _ in range(args.calls):
                            start = time.perf_counter_ns()
                            status = fn(*fn_args)
                            samples[key].append((time.perf_counter_ns() - start) / 1e3)
                            if status != 0:
                                lib.check(status, name)
                        torch.cuda.synchronize()
                med = {key: statistics.median(values) for key, values in samples.items()}
                rows.append((name, shape, mask, med["a"], med["b"], med["a2"]))
                print(f"{name:8s} {shape:16s} {mask:6s}: a {med['a']:.2f} us  b {med['b']:.2f} us  "
                      f"b/a {med['b'] / med['a']:.3f}  a2/a {med['a2'] / med['a']:.3f}", flush=True)
    device = torch.cuda.get_device_name()
    date = datetime.date.today().isoformat()
    lines = ["device,date,torch,pass,shape,mask,a_us,b_us,a_again_us,b_over_a,a_again_over_a"]
    lines += [f"{device},{date},{torch.__version__},{r[0]},{r[1]},{r[2]},{r[3]:.3f},{r[4]:.3f},{r[5]:.3f},"
              f"{r[4] / r[3]:.4f},{r[5] / r[3]:.4f}" for r in rows]
    if args.out:
        open(args.out, "w").write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
