"""Host time of a PyTorch training call, flashgen.torch.attention against SDPA's cuDNN backend in the same process:
per shape, the forward with autograd (inputs requiring grad) and its backward (torch.autograd.backward), each timed
from the call to its return (median of --calls, the implementations' samples interleaved so that both see the same
machine), once with the GPU idle before the call (the stream drained: the host wakes from the wait) and once with the
GPU busy (a spin kernel queued first, as in a training loop whose host runs ahead); the backward's synchronized wall
time; and the kernels' own time per pass (torch.profiler's CUDA kernels, summed). Random inputs; bf16 by default.
    FLASHGEN_LIBRARY=build/libflashgen.so python bench/host_time.py [--csv FILE] [--profile FILE]
--profile FILE: cProfile of flashgen's forward and backward calls at each shape, top entries, into FILE.
The goal columns: host time at or below cuDNN's; bwd_wall within 5% of flashgen's kernels plus cuDNN's host time.
"""
import argparse
import cProfile
import datetime
import io
import pstats
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# (batch, seqlen): the training shapes at 16k tokens, and a tiny one.
SHAPES = [(16, 1024), (4, 4096), (1, 16384), (1, 128)]


def inputs(batch, seqlen, heads, head_dim, dtype, layout):
    shape = (batch, seqlen, heads, head_dim) if layout == "bshd" else (batch, heads, seqlen, head_dim)
    q, k, v = (torch.randn(shape, device="cuda", dtype=dtype).requires_grad_() for _ in range(3))
    return q, k, v, torch.randn(shape, device="cuda", dtype=dtype)


def host_sample(fn, busy):
    """Host time of one fn() call from call to return in µs: the stream drained before it, and with busy a spin kernel
    of about 1 ms queued so that the GPU is still working when the call is made."""
    torch.cuda.synchronize()
    if busy:
        torch.cuda._sleep(2_000_000)
    start = time.perf_counter_ns()
    fn()
    return (time.perf_counter_ns() - start) / 1e3


def kernel_us(fn, reps=5):
    """Mean GPU time of the CUDA kernels (and memsets) one fn() queues, from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    total = 0.0
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            total += event.device_time if hasattr(event, "device_time") else event.cuda_time
    return total / reps


class Case:
    """One implementation at one problem: its forward with autograd, and a backward of the forward's graph."""

    def __init__(self, name, forward, dout):
        self.name, self.forward, self.dout = name, forward, dout
        self.out = None

    def run_forward(self):
        self.out = self.forward()

    def run_backward(self):
        torch.autograd.backward(self.out, self.dout)

    def forward_then_backward(self):
        self.run_forward()
        self.run_backward()


def wall_sample(case):
    """Wall time of a synchronized backward call in µs (its forward run and drained first)."""
    case.run_forward()
    torch.cuda.synchronize()
    start = time.perf_counter_ns()
    case.run_backward()
    torch.cuda.synchronize()
    return (time.perf_counter_ns() - start) / 1e3


def measure(cases, calls):
    """{case name: row} with every host and wall sample of the cases taken in turn, call by call."""
    samples = {case.name: {key: [] for key in ("fwd_host_us", "bwd_host_us", "fwd_busy_us", "bwd_busy_us",
                                               "bwd_wall_us")} for case in cases}
    for _ in range(calls):
        for case in cases:
            own = samples[case.name]
            for busy in (False, True):
                own["fwd_busy_us" if busy else "fwd_host_us"].append(host_sample(case.run_forward, busy))
                own["bwd_busy_us" if busy else "bwd_host_us"].append(host_sample(case.run_backward, busy))
            own["bwd_wall_us"].append(wall_sample(case))
    rows = {}
    for case in cases:
        row = rows[case.name] = {key: statistics.median(values) for key, values in samples[case.name].items()}
        row["fwd_kernel_us"] = kernel_us(case.run_forward)
        row["bwd_kernel_us"] = kernel_us(case.forward_then_backward) - row["fwd_kernel_us"]
    return rows


def profile_calls(case, calls, stream):
    """cProfile of calls forwards and backwards (synchronized between calls), the top entries by own time."""
    profiler = cProfile.Profile()
    for _ in range(calls):
        torch.cuda.synchronize()
        profiler.enable()
        case.run_forward()
        profiler.disable()
        torch.cuda.synchronize()
        profiler.enable()
        case.run_backward()
        profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
    stream.write(text.getvalue())


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--causal", choices=["yes", "no", "both"], default="both")
    parser.add_argument("--shapes", nargs="+", help="BATCHxSEQLEN, e.g. 16x1024 (default: the issue's set)")
    parser.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    parser.add_argument("--csv")
    parser.add_argument("--profile", help="write cProfile tables of flashgen's calls here")
    args = parser.parse_args()
    import flashgen
    import flashgen.torch as fg

    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes] if args.shapes else SHAPES
    causals = {"yes": [True], "no": [False], "both": [True, False]}[args.causal]
    torch.manual_seed(0)
    profile_out = open(args.profile, "w") if args.profile else None
    device = torch.cuda.get_device_name()
    date = datetime.date.today().isoformat()
    autograd = fg.backend(detail=True)["autograd"]
    header = ("device,date,torch,cudnn,flashgen,backend,autograd,dtype,batch,seqlen,heads,head_dim,causal,impl,"
              "fwd_host_us,bwd_host_us,fwd_busy_us,bwd_busy_us,bwd_wall_us,fwd_kernel_us,bwd_kernel_us")
    lines = [header]
    print(header, flush=True)
    for batch, seqlen in shapes:
        for head_dim in args.head_dims:
            for causal in causals:
                q, k, v, dout = inputs(batch, seqlen, args.heads, head_dim, dtype, "bshd")
                qt, kt, vt, doutt = inputs(batch, seqlen, args.heads, head_dim, dtype, "bhsd")

                def sdpa(qt=qt, kt=kt, vt=vt, causal=causal):
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

                cases = [Case("flashgen", lambda q=q, k=k, v=v, causal=causal: fg.attention(q, k, v, causal=causal),
                              dout),
                         Case("cudnn_sdpa", sdpa, doutt)]
                for case in cases:
                    for _ in range(3):  # compile, load, warm the allocator
                        case.forward_then_backward()
                rows = measure(cases, args.calls)
                for case in cases:
                    row = rows[case.name]
                    line = (f"{device},{date},{torch.__version__},{torch.backends.cudnn.version()},"
                            f"{flashgen.version()},{fg.backend()},{autograd},{args.dtype},{batch},{seqlen},"
                            f"{args.heads},{head_dim},{int(causal)},{case.name},{row['fwd_host_us']:.1f},"
                            f"{row['bwd_host_us']:.1f},{row['fwd_busy_us']:.1f},{row['bwd_busy_us']:.1f},"
                            f"{row['bwd_wall_us']:.1f},{row['fwd_kernel_us']:.1f},{row['bwd_kernel_us']:.1f}")
                    lines.append(line)
                    print(line, flush=True)
                fgrow, cdrow = rows["flashgen"], rows["cudnn_sdpa"]
                goal = fgrow["bwd_kernel_us"] + cdrow["bwd_host_us"]
                print(f"# B{batch}x{seqlen} d{head_dim} causal={int(causal)}: fwd host {fgrow['fwd_host_us']:.0f} vs "
                      f"{cdrow['fwd_host_us']:.0f} us (busy {fgrow['fwd_busy_us']:.0f} vs {cdrow['fwd_busy_us']:.0f}), "
                      f"bwd host {fgrow['bwd_host_us']:.0f} vs {cdrow['bwd_host_us']:.0f} us (busy "
                      f"{fgrow['bwd_busy_us']:.0f} vs {cdrow['bwd_busy_us']:.0f}), bwd wall {fgrow['bwd_wall_us']:.0f} us against a goal of "
                      f"{1.05 * goal:.0f} (kernels {fgrow['bwd_kernel_us']:.0f} + cuDNN host "
                      f"{cdrow['bwd_host_us']:.0f}, +5%)", flush=True)
                if profile_out is not None:
                    profile_out.write(f"==== flashgen B{batch}x{seqlen} d{head_dim} causal={int(causal)}\n")
                    profile_calls(cases[0], 10, profile_out)
                del q, k, v, dout, qt, kt, vt, doutt, cases
    if args.csv:
        with open(args.csv, "w") as f:
            f.write("\n".join(lines) + "\n")
    if profile_out is not None:
        profile_out.close()


if __name__ == "__main__":
    main()
