#!/usr/bin/env python3
"""Kernel time of two builds of libflashgen side by side: both libraries loaded into one process through their
C ABIs, called on the same random tensors of the standard grid (batch * seqlen = 16384, heads * head_dim = 2048),
forward and backward, and timed interleaved (A, B, A, B, ...) with CUDA events after an L2 flush. A third column
times A against itself, the run-to-run noise the A/B difference is read against. Writes a CSV.

    python3 bench/ab_libraries.py --a old/libflashgen.so --b new/libflashgen.so [--quick] [--out FILE]
        [--passes forward,backward] [--head-dims 64,128,256] [--dtypes fp16,bf16] [--deterministic] [--softcap C]

With --b-deterministic only B runs the deterministic strategy: --a and --b naming the same build then time the
atomic strategy against the deterministic one.
"""

import argparse
import ctypes
import datetime
import statistics
import sys

import torch


class Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("shape", ctypes.c_int64 * 4),
                ("stride", ctypes.c_int64 * 4)]


# flashgen_attention_options' leading fields in the two layouts a build may have: since the options carry their size,
# (size_t size, float softmax_scale, int mask, int deterministic, float softcap); before, the same without size.
# Either build reads the rest (up to 104 bytes) as zeros: no ALiBi, sinks, chunk or variant; a sized build's window
# fields follow the soft cap.
class SizedOptions(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("softmax_scale", ctypes.c_float), ("mask", ctypes.c_int),
                ("deterministic", ctypes.c_int), ("softcap", ctypes.c_float), ("window_left", ctypes.c_int32),
                ("window_right", ctypes.c_int32), ("rest", ctypes.c_byte * 72)]


class LegacyOptions(ctypes.Structure):
    _fields_ = [("softmax_scale", ctypes.c_float), ("mask", ctypes.c_int), ("deterministic", ctypes.c_int),
                ("rest", ctypes.c_byte * 92)]


def view(t, code):
    return Tensor(t.data_ptr(), code, tuple(t.shape), tuple(t.stride()))


class Library:
    def __init__(self, path):
        self.lib = ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)
        self.lib.flashgen_last_error.restype = ctypes.c_char_p
        self.path = path
        # A build whose options carry their size refuses a size of 0 by name, before looking at the tensors.
        probe = SizedOptions()
        self.lib.flashgen_attention_forward(None, None, None, None, None, ctypes.byref(probe), None)
        self.sized = self.lib.flashgen_last_error().decode().startswith("opts.size")

    # mask: none, causal or window (window_left keys before the diagonal, none after).
    def options(self, mask, deterministic, softcap, window_left):
        code = {"none": 0, "causal": 1, "window": 3}[mask]
        if self.sized:
            return SizedOptions(ctypes.sizeof(SizedOptions), 0.0, code, 1 if deterministic else 0, softcap,
                                window_left, 0)
        if softcap > 0 or mask == "window":
            raise RuntimeError(f"{self.path}: a build whose options carry no size takes no --softcap or window here")
        return LegacyOptions(0.0, code, 1 if deterministic else 0)

    def check(self, status, what):
        if status != 0:
            raise RuntimeError(f"{self.path}: {what}: {self.lib.flashgen_last_error().decode()}")


def mask_label(mask, window):
    """The name a mask's rows and CSV lines carry: the window's with its keys before the diagonal (window1024)."""
    return f"window{window}" if mask == "window" else mask


class Problem:
    """One problem of the standard grid (batch * seqlen = 16384, heads * head_dim = 2048) on random tensors, called
    through a library's C ABI on stream with that library's options (Library.options)."""

    def __init__(self, dtype, code, head_dim, seqlen, stream):
        batch, heads = 16384 // seqlen, 2048 // head_dim
        self.inputs = [torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=dtype) for _ in range(4)]
        q, k, v, dout = self.inputs
        out = torch.empty_like(q)
        self.lse = torch.empty(batch, heads, seqlen, device="cuda", dtype=torch.float32)
        self.grads_out = [torch.empty_like(t) for t in (q, k, v)]
        self.views = [view(t, code) for t in (q, k, v, out)]
        self.grads = [view(t, code) for t in [dout] + self.grads_out]
        self.out = out  # the tensors stay alive while their views are in use
        self.stream = stream

    def forward(self, lib, opts):
        lib.check(lib.lib.flashgen_attention_forward(
            *(ctypes.byref(x) for x in self.views), ctypes.c_void_p(self.lse.data_ptr()), ctypes.byref(opts),
            self.stream), "forward")

    def backward(self, lib, opts):
        refs = [ctypes.byref(x) for x in self.views] + [ctypes.byref(self.grads[0])]
        lib.check(lib.lib.flashgen_attention_backward(
            *refs, ctypes.c_void_p(self.lse.data_ptr()), *(ctypes.byref(x) for x in self.grads[1:]),
            ctypes.byref(opts), self.stream), "backward")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--a", required=True, help="libflashgen.so of the build before")
    parser.add_argument("--b", required=True, help="libflashgen.so of the build after")
    parser.add_argument("--quick", action="store_true", help="seqlen 1k and 4k only")
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--passes", default="forward,backward", help="comma-separated (default: %(default)s)")
    parser.add_argument("--head-dims", default="64,128,256", help="comma-separated (default: %(default)s)")
    parser.add_argument("--dtypes", default="fp16,bf16", help="comma-separated (default: %(default)s)")
    parser.add_argument("--deterministic", action="store_true", help="the backward's deterministic dQ strategy")
    parser.add_argument("--b-deterministic", action="store_true",
                        help="B alone takes the deterministic dQ strategy, A the atomic one")
    parser.add_argument("--softcap", type=float, default=0.0, help="> 0: soft-capped scores (options.softcap)")
    parser.add_argument("--masks", default="none,causal",
                        help="comma-separated, of none, causal and window (default: %(default)s)")
    parser.add_argument("--window", type=int, default=1024, help="the window mask's keys before the diagonal")
    parser.add_argument("--out")
    args = parser.parse_args()
    passes = args.passes.split(",")
    head_dims = [int(d) for d in args.head_dims.split(",")]
    known = {"fp16": (torch.float16, 0), "bf16": (torch.bfloat16, 1)}
    dtypes = [known[name] for name in args.dtypes.split(",")]
    a, b = Library(args.a), Library(args.b)
    seqlens = [1024, 4096] if args.quick else [512, 1024, 2048, 4096, 8192, 16384]
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    rows = []
    torch.manual_seed(0)
    for dtype, code in dtypes:
        for head_dim in head_dims:
            for mask in args.masks.split(","):
                for seqlen in seqlens:
                    problem = Problem(dtype, code, head_dim, seqlen, stream)
                    opts = {lib: lib.options(mask, args.deterministic or (lib is b and args.b_deterministic),
                                             args.softcap, args.window) for lib in (a, b)}

                    def forward(lib):
                        problem.forward(lib, opts[lib])

                    def backward(lib):
                        problem.backward(lib, opts[lib])

                    for name, call in (("forward", forward), ("backward", backward)):
                        if name not in passes:
                            continue
                        for lib in (a, b):
                            forward(lib)
                            call(lib)  # compile or load, choose
                        torch.cuda.synchronize()
                        times = {"a": [], "b": [], "a2": []}
                        for _ in range(args.samples):
                            for key, lib in (("a", a), ("b", b), ("a2", a)):
                                flush.zero_()
                                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                                start.record()
                                call(lib)
                                end.record()
                                end.synchronize()
                                times[key].append(start.elapsed_time(end))
                        med = {key: statistics.median(values) for key, values in times.items()}
                        mask_name = mask_label(mask, args.window)
                        rows.append((name, str(dtype).split(".")[-1], head_dim, mask_name, seqlen, med["a"], med["b"],
                                     med["a2"], med["b"] / med["a"], med["a2"] / med["a"]))
                        print(f"{name:8s} {rows[-1][1]:8s} d{head_dim:<3d} {mask_name:6s} "
                              f"{seqlen:5d}: a {med['a']:.3f} ms  b {med['b']:.3f} ms  b/a {rows[-1][8]:.3f}  "
                              f"a2/a {rows[-1][9]:.3f}", flush=True)
    device = torch.cuda.get_device_name()
    date = datetime.date.today().isoformat()
    header = ("device,date,torch,pass,deterministic,softcap,dtype,head_dim,mask,seqlen,a_ms,b_ms,a_again_ms,"
              "b_over_a,a_again_over_a")
    strategy = "b" if args.b_deterministic and not args.deterministic else int(args.deterministic)
    lines = [header] + [f"{device},{date},{torch.__version__},{r[0]},{strategy},{args.softcap:g},{r[1]},{r[2]},{r[3]},{r[4]},{r[5]:.4f},"
                        f"{r[6]:.4f},{r[7]:.4f},{r[8]:.4f},{r[9]:.4f}" for r in rows]
    if args.out:
        open(args.out, "w").write("\n".join(lines) + "\n")
    ratios = [r[8] for r in rows]
    noise = [r[9] for r in rows]
    print(f"b/a: median {statistics.median(ratios):.4f}, range {min(ratios):.4f}-{max(ratios):.4f}; "
          f"a/a (noise): median {statistics.median(noise):.4f}, range {min(noise):.4f}-{max(noise):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
