"""What the dense variant benchmarks (bench_alibi.py, bench_softcap.py, bench_sinks.py) share: their command line,
the standard grid of random bf16 inputs (batch * seqlen = 16384 tokens, heads * head_dim = 2048, causal on and
off), the ratios of flashgen's variant call to its plain call and to each peer, and the CSV they write."""

import argparse
import datetime
import os

import bench_fwd


def parser(doc):
    """The shared options; a benchmark adds its own before parse_args()."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lib", default=None)
    p.add_argument("--seqlens", type=int, nargs="+", default=[1024, 4096, 16384])
    p.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    p.add_argument("--samples", type=int, default=15)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--flush-mb", type=int, default=256)
    p.add_argument("--out", default=None)
    return p


class Point:
    """One point of the grid: its sizes, seeded random q, k, v, dout [batch, seqlen, heads, head_dim] and generator,
    the plain attention's FLOPs, and the CSV row's leading columns (result)."""

    def __init__(self, torch, flashgen, head_dim, seqlen, causal):
        self.head_dim, self.seqlen, self.causal = head_dim, seqlen, causal
        self.heads, self.batch = 2048 // head_dim, max(1, 16384 // seqlen)
        self.gen = torch.Generator(device="cuda").manual_seed(seqlen + head_dim)
        self.q, self.k, self.v, self.dout = (
            torch.randn(self.batch, seqlen, self.heads, head_dim, device="cuda", generator=self.gen,
                        dtype=torch.bfloat16) for _ in range(4))
        self.flops = 4.0 * self.batch * self.heads * seqlen * seqlen * head_dim * (0.5 if causal else 1.0)
        self.result = {"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
                       "torch": torch.__version__, "flashgen": flashgen.version(), "dtype": "bf16",
                       "head_dim": head_dim, "batch": self.batch, "seqlen": seqlen, "heads": self.heads,
                       "causal": int(causal)}
        self.label = f"d{head_dim} {seqlen} causal={causal}"


def points(torch, flashgen, args):
    """The grid's points, head_dim outermost, then seqlen, then causal off and on."""
    for head_dim in args.head_dims:
        for seqlen in args.seqlens:
            for causal in (False, True):
                yield Point(torch, flashgen, head_dim, seqlen, causal)


def sdpa(torch, attn_mask):
    """scaled_dot_product_attention on [batch, seqlen, heads, head_dim] tensors with a materialized attn_mask (bool, or
    a float bias; [batch or 1, heads or 1, seqlen, seqlen]), on the memory-efficient backend, one that takes an
    arbitrary mask."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def call(q, k, v):
        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  attn_mask=attn_mask).transpose(1, 2)

    return call


def ran(result, name):
    """Whether call `name` ran: time_calls records NaN for a call that could not run (NaN != NaN)."""
    return result.get(f"{name}_fwd_ms") == result.get(f"{name}_fwd_ms")


def add_errors(torch, result, calls, pt, rows_at, want, skip):
    """<name>_max_error: each call's output on rows_at (query rows) against want ([batch, rows, heads, head_dim],
    fp32), but the calls in skip and those that could not run."""
    for name, call in calls.items():
        if name in skip or not ran(result, name):
            continue
        with torch.no_grad():
            got = call(pt.q, pt.k, pt.v)[:, rows_at].float()
        result[f"{name}_max_error"] = round((got - want).abs().max().item(), 4)


def add_ratios(result, plain, peers):
    """<pass>_vs_<plain> and <pass>_vs_<peer> for each peer timed: flashgen's variant TFLOP/s over theirs."""
    for p in ("fwd", "bwd"):
        mine = result[f"flashgen_{p}_tflops"]
        result[f"{p}_vs_{plain.removeprefix('flashgen_')}"] = round(mine / result[f"{plain}_{p}_tflops"], 3)
        for peer in peers:
            if f"{peer}_{p}_tflops" in result:
                result[f"{p}_vs_{peer}"] = round(mine / result[f"{peer}_{p}_tflops"], 3)


def write(rows, name, out=None):
    """The rows as bench/results/<name>_<device>_<date>.csv (or out), every key any row has a column."""
    keys = []
    for row in rows:
        keys += [key for key in row if key not in keys]
    out = out or os.path.join("bench", "results", f"{name}_{bench_fwd.slug(rows[0]['device'])}_{rows[0]['date']}.csv")
    bench_fwd.write_csv(out, keys, rows)
    print(f"wrote {out}")
