#!/usr/bin/env python3
"""Sustained forward-attention timing: flashgen against PyTorch SDPA's cuDNN and FlashAttention-2 backends, each
called back to back (no L2 flush, no gap) in blocks of --calls, the three taking turns for --rounds rounds, with
the GPU's SM clock and power sampled by nvidia-smi during every block. Where bench_fwd.py times isolated calls
(L2 flushed, GPU idle in between), this shows the kernels at the clocks a long run settles to under the power
limit, and whether two implementations run at the same ones. Writes a CSV and prints a table.

Run on a GPU machine:  python3 bench/bench_sustained.py [--lib build/libflashgen.so] [--points ...]
"""

import argparse
import csv
import os
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_fwd import REPO_ROOT, import_flashgen_torch, slug  # noqa: E402

CSV_COLUMNS = [
    "device", "date", "torch_version", "cuda_version", "cudnn_version", "flashgen_version",
    "dtype", "causal", "head_dim", "batch", "seqlen", "heads", "calls", "rounds",
    "flashgen_ms", "flashgen_sm_mhz", "flashgen_watts", "cudnn_ms", "cudnn_sm_mhz", "cudnn_watts",
    "fa2_ms", "fa2_sm_mhz", "fa2_watts", "ratio_vs_cudnn", "ratio_vs_fa2",
]


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lib", default=None, help="path of libflashgen.so (as in bench_fwd.py)")
    parser.add_argument("--out", default=None,
                        help="CSV path (default: bench/results/sustained_<device-slug>_<YYYY-MM-DD>.csv)")
    parser.add_argument("--points", default="fp16:0:128:16384,bf16:0:128:16384",
                        help="comma-separated dtype:causal:head_dim:seqlen points; batch = 16384 / seqlen tokens, "
                             "heads = 2048 / head_dim (default: %(default)s)")
    parser.add_argument("--calls", type=int, default=100, help="back-to-back calls per block (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="blocks per implementation, taken in turns; the medians are reported "
                             "(default: %(default)s)")
    args = parser.parse_args()
    points = []
    for item in args.points.split(","):
        fields = item.strip().split(":")
        if len(fields) != 4 or fields[0] not in ("fp16", "bf16") or fields[1] not in ("0", "1"):
            parser.error(f"--points: expected dtype:causal:head_dim:seqlen such as bf16:0:128:16384, got {item!r}")
        points.append((fields[0], fields[1] == "1", int(fields[2]), int(fields[3])))
    args.points = points
    if args.calls < 1 or args.rounds < 1:
        parser.error("--calls and --rounds must be >= 1")
    return args


class ClockSampler:
    """nvidia-smi's SM clock and power every 50 ms, kept with the host time they arrived at."""

    def __init__(self):
        self.samples = []
        self._process = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits", "-lms", "50"],
            stdout=subprocess.PIPE, text=True)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self):
        for line in self._process.stdout:
            fields = line.split(",")
            if len(fields) == 2:
                try:
                    self.samples.append((time.time(), float(fields[0]), float(fields[1])))
                except ValueError:
                    pass

    def between(self, begin, end):
        inside = [s for s in self.samples if begin <= s[0] <= end]
        if not inside:
            return float("nan"), float("nan")
        return statistics.mean(s[1] for s in inside), statistics.mean(s[2] for s in inside)

    def close(self):
        self._process.kill()


def main():
    args = parse_args()
    flashgen, flashgen_torch = import_flashgen_torch(args.lib)

    import datetime
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if not torch.cuda.is_available():
        sys.exit("error: no CUDA device visible to torch")
    device_name = torch.cuda.get_device_name()
    today = datetime.date.today().isoformat()
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    meta = {
        "device": device_name, "date": today, "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda or "",
        "cudnn_version": f"{cudnn // 10000}.{cudnn // 100 % 100}.{cudnn % 100}" if cudnn else "",
        "flashgen_version": flashgen.version(),
    }
    out_path = args.out or os.path.join(REPO_ROOT, "bench", "results", f"sustained_{slug(device_name)}_{today}.csv")
    sampler = ClockSampler()
    time.sleep(0.5)  # nvidia-smi's first lines
    rows = []
    for dtype_name, causal, head_dim, seqlen in args.points:
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype_name]
        batch, heads = max(1, 16384 // seqlen), max(1, 2048 // head_dim)
        torch.manual_seed(0)
        q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=dtype) for _ in range(3))
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

        def sdpa(backend):
            def call():
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
            return call

        impls = {
            "flashgen": lambda: flashgen_torch.attention(q, k, v, causal=causal),
            "cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
            "fa2": sdpa(SDPBackend.FLASH_ATTENTION),
        }
        results = {name: [] for name in impls}
        for name, call in impls.items():  # compile, load and warm up each before any block is timed
            for _ in range(5):
                call()
        torch.cuda.synchronize()
        for _ in range(args.rounds):
            for name, call in impls.items():
                start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                begin = time.time()
                start.record()
                for _ in range(args.calls):
                    call()
                stop.record()
                torch.cuda.synchronize()
                mhz, watts = sampler.between(begin + 0.05, time.time())
                results[name].append((start.elapsed_time(stop) / args.calls, mhz, watts))
        row = dict(meta, dtype=dtype_name, causal=int(causal), head_dim=head_dim, batch=batch, seqlen=seqlen,
                   heads=heads, calls=args.calls, rounds=args.rounds)
        for name, blocks in results.items():
            row[f"{name}_ms"] = statistics.median(b[0] for b in blocks)
            row[f"{name}_sm_mhz"] = round(statistics.median(b[1] for b in blocks))
            row[f"{name}_watts"] = round(statistics.median(b[2] for b in blocks))
        row["ratio_vs_cudnn"] = row["cudnn_ms"] / row["flashgen_ms"]
        row["ratio_vs_fa2"] = row["fa2_ms"] / row["flashgen_ms"]
        rows.append(row)
        print(f"[{dtype_name} causal={int(causal)} d={head_dim} seqlen={seqlen}] "
              + ", ".join(f"{n} {row[n + '_ms']:.3f} ms at {row[n + '_sm_mhz']} MHz, {row[n + '_watts']} W"
                          for n in impls), flush=True)
    sampler.close()
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    with open(out_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    print(f"# wrote {out_path}")
    print(f"\n{device_name}, {today}: sustained forward, ms per call (median of {args.rounds} blocks of {args.calls})\n")
    print("| dtype | causal | d | seqlen | flashgen | cuDNN | FA2 | vs cuDNN | vs FA2 | SM MHz (flashgen / cuDNN) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['dtype']} | {'yes' if r['causal'] else 'no'} | {r['head_dim']} | {r['seqlen']} | "
              f"{r['flashgen_ms']:.3f} | {r['cudnn_ms']:.3f} | {r['fa2_ms']:.3f} | {r['ratio_vs_cudnn']:.2f} | "
              f"{r['ratio_vs_fa2']:.2f} | {r['flashgen_sm_mhz']} / {r['cudnn_sm_mhz']} |")


if __name__ == "__main__":
    main()
