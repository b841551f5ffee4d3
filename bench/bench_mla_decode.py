#!/usr/bin/env python3
"""MLA decoding (DeepSeek-V3/R1, Kimi-K2): new query tokens of 128 (or fewer) heads against one latent kv head per
sequence, keys of 576 columns (512 latent + 64 rope) whose first 512 are the values, in a paged cache (pages of 64,
scattered in a shuffled order). flashgen's KV-cache call over the latent (v_cache a view of k_cache's first 512
columns, no copy) against peers the lent machine runs, in one process on the same inputs: SDPA's memory-efficient
backend and FlexAttention over the expanded latent (keys and values gathered from the pages, the query heads sharing
the one kv head), and the GEMM form torch runs MLA's absorbed decode in (scores = q Kᵀ for every head at once,
softmax, then P V). Each implementation's calls walk copies of the inputs that together exceed the L2 cache, timed
with CUDA events after warm-up. Reports microseconds per call, GB/s of the latent read once (its bytes over the
time) and its fraction of the HBM bandwidth, and TFLOP/s (2 (576 + 512) per query row and key). Writes a CSV with
device, date and versions.

    python3 bench/bench_mla_decode.py [--batch 1 16 64 128] [--keys 1024 4096 16384 32768] [--heads 128]
                                      [--seqlen-q 1] [--page 64] [--peers efficient,flex,bmm] [--out FILE]
"""
import argparse
import ctypes
import datetime
import math

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashgen
from flashgen import _lib
from flashgen.torch._checks import _mask_and_window
from flashgen.torch._kvcache_calls import _kvcache_args

HBM_BYTES_PER_S = {"H100": 3.35e12, "H200": 4.8e12}
L2_WALK_BYTES = 400 << 20
D_QK, D_V = 576, 512


def hbm_peak(device):
    return next((peak for name, peak in HBM_BYTES_PER_S.items() if name in device), float("nan"))


def event_us(calls, reps=3):
    """Mean microseconds per call over `reps` passes of calls, after two warm-up passes."""
    for _ in range(2):
        for call in calls:
            call()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        for call in calls:
            call()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) * 1000.0 / (reps * len(calls))


def flashgen_call(q, cache, table, lens, out, lse, mask, splits):
    """flashgen_attention_kvcache over the paged latent: v_cache the first 512 columns of k_cache."""
    args = _kvcache_args(q, cache, cache[..., :D_V], None, None, lens, table, out, lse, 0.0, mask, splits,
                         (-1, -1), None)
    call = _lib.function("flashgen_attention_kvcache")
    ref = ctypes.byref(args)

    def run():
        status = call(ref, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
        if status != 0:
            raise RuntimeError(f"flashgen_attention_kvcache failed: {_lib.last_error()}")
    run.args = args  # keeps the struct alive with the closure
    return run


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64, 128])
    parser.add_argument("--keys", type=int, nargs="+", default=[1024, 4096, 16384, 32768])
    parser.add_argument("--heads", type=int, nargs="+", default=[128])
    parser.add_argument("--seqlen-q", type=int, nargs="+", default=[1])
    parser.add_argument("--page", type=int, default=64)
    parser.add_argument("--splits", type=int, nargs="+", default=[0], help="flashgen's num_splits (0: its choice)")
    parser.add_argument("--max-tokens", type=int, default=1 << 21, help="skip batch * keys above this")
    parser.add_argument("--peers", default="efficient,flex,bmm")
    parser.add_argument("--check", action="store_true", help="compare flashgen's output with the bmm peer's")
    parser.add_argument("--out")
    args = parser.parse_args()
    peers = [p for p in args.peers.split(",") if p]
    device = torch.cuda.get_device_name()
    peak = hbm_peak(device)
    dtype = torch.bfloat16
    scale = 1.0 / math.sqrt(D_QK)
    mask, _ = _mask_and_window(True, "bottom_right", (-1, -1))
    flex = None
    if "flex" in peers:
        from torch.nn.attention.flex_attention import flex_attention
        flex = torch.compile(flex_attention, dynamic=False)
    print(f"{device}; HBM {peak / 1e12:.2f} TB/s; torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}")
    rows = []
    for heads in args.heads:
        for sq in args.seqlen_q:
            for batch in args.batch:
                for keys in args.keys:
                    if batch * keys > args.max_tokens:
                        continue
                    latent_bytes = batch * keys * D_QK * 2
                    copies = max(1, min(8, math.ceil(L2_WALK_BYTES / latent_bytes)))
                    gen = torch.Generator(device="cuda").manual_seed(batch * 131 + keys)
                    pages_per_seq = keys // args.page
                    sets = []
                    for _ in range(copies):
                        q = torch.randn(batch, sq, heads, D_QK, device="cuda", dtype=dtype, generator=gen)
                        latent = torch.randn(batch, keys, 1, D_QK, device="cuda", dtype=dtype, generator=gen)
                        order = torch.randperm(batch * pages_per_seq, device="cuda", generator=gen)
                        cache = torch.empty(batch * pages_per_seq, args.page, 1, D_QK, device="cuda", dtype=dtype)
                        cache[order] = latent.reshape(batch * pages_per_seq, args.page, 1, D_QK)
                        table = order.view(batch, pages_per_seq).to(torch.int32)
                        sets.append((q, latent, cache, table))
                    lens = torch.full((batch,), keys, dtype=torch.int32, device="cuda")  # the new tokens already cached
                    point = {"device": device, "batch": batch, "keys": keys, "heads": heads, "seqlen_q": sq,
                             "page": args.page, "latent_bytes": latent_bytes}
                    flops = 2.0 * batch * heads * sq * keys * (D_QK + D_V)
                    times = {}
                    outs = []
                    for splits in args.splits:
                        calls = []
                        for q, _, cache, table in sets:
                            out = torch.empty(batch, sq, heads, D_V, device="cuda", dtype=dtype)
                            lse = torch.empty(batch, heads, sq, device="cuda", dtype=torch.float32)
                            outs.append(out)
                            # Every sequence holds `keys` keys, the new tokens' among them (appended before the call).
                            calls.append(flashgen_call(q, cache, table, lens, out, lse, mask, splits))
                        with torch.no_grad():
                            times["flashgen" + (f"_splits{splits}" if splits else "")] = event_us(calls)
                    # The peers over the expanded latent: [batch, heads, seq, dim] views, the kv head broadcast.
                    expanded = [(q.transpose(1, 2), latent.transpose(1, 2)) for q, latent, _, _ in sets]
                    causal_mask = None
                    if sq > 1:
                        i = torch.arange(sq, device="cuda")[:, None] + (keys - sq)
                        causal_mask = torch.arange(keys, device="cuda")[None, :] <= i
                    if "efficient" in peers:
                        try:
                            with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION), torch.no_grad():
                                calls = [lambda q=q, k=k: F.scaled_dot_product_attention(
                                    q, k.expand(-1, heads, -1, -1), k[..., :D_V].expand(-1, heads, -1, -1),
                                    attn_mask=causal_mask, scale=scale) for q, k in expanded]
                                times["sdpa_efficient"] = event_us(calls)
                        except RuntimeError as error:
                            print(f"  sdpa_efficient failed: {str(error).splitlines()[0]}")
                    if flex is not None:
                        try:
                            with torch.no_grad():
                                calls = [lambda q=q, k=k: flex(q, k, k[..., :D_V], scale=scale, enable_gqa=True)
                                         for q, k in expanded]
                                times["flex"] = event_us(calls)
                        except Exception as error:  # noqa: BLE001 - any compile or launch failure skips the peer
                            print(f"  flex failed: {str(error).splitlines()[0][:200]}")
                    if "bmm" in peers:
                        def bmm(q, k):
                            # [batch, heads * sq, 576] x [batch, 576, keys]: one GEMM per sequence for all heads.
                            qs = q.transpose(1, 2).reshape(batch, sq * heads, D_QK)
                            s = torch.bmm(qs, k[:, 0].transpose(1, 2)).float() * scale
                            if causal_mask is not None:
                                s = s.view(batch, sq, heads, keys).masked_fill(
                                    ~causal_mask[None, :, None, :], float("-inf")).view(batch, sq * heads, keys)
                            p = torch.softmax(s, dim=-1).to(dtype)
                            return torch.bmm(p, k[:, 0, :, :D_V])
                        try:
                            with torch.no_grad():
                                calls = [lambda q=q, k=k: bmm(q, k) for q, k in expanded]
                                times["torch_bmm"] = event_us(calls)
                                if args.check:  # flashgen's first output against fp32 attention over the latent
                                    q, k = expanded[0]
                                    qs = q.transpose(1, 2).reshape(batch, sq * heads, D_QK).float()
                                    s = torch.bmm(qs, k[:, 0].float().transpose(1, 2)) * scale
                                    if causal_mask is not None:
                                        s = s.view(batch, sq, heads, keys).masked_fill(
                                            ~causal_mask[None, :, None, :], float("-inf")).view(batch, sq * heads, keys)
                                    want = torch.bmm(torch.softmax(s, dim=-1), k[:, 0, :, :D_V].float())
                                    err = (outs[0].float().view(batch, sq * heads, D_V) - want).abs().max().item()
                                    print(f"  max |flashgen - fp32| = {err:.4f} (outputs up to "
                                          f"{want.abs().max().item():.3f})")
                        except RuntimeError as error:
                            print(f"  torch_bmm failed: {str(error).splitlines()[0]}")
                    best_peer = min((t for n, t in times.items() if not n.startswith("flashgen")), default=float("nan"))
                    line = [f"b{batch:<3} k{keys:<6} h{heads} sq{sq}:"]
                    for name, us in times.items():
                        gbs = latent_bytes / (us * 1e-6) / 1e9
                        tflops = flops / (us * 1e-6) / 1e12
                        rows.append({**point, "impl": name, "us": f"{us:.2f}", "GBps": f"{gbs:.0f}",
                                     "hbm_fraction": f"{gbs * 1e9 / peak:.3f}", "TFLOPs": f"{tflops:.1f}",
                                     "vs_best_peer": f"{best_peer / us:.2f}" if name.startswith("flashgen") else ""})
                        line.append(f"{name} {us:.1f}us {gbs:.0f}GB/s {tflops:.0f}TF")
                    print("  ".join(line), flush=True)
                    del sets, expanded, outs
                    torch.cuda.empty_cache()

    date = datetime.date.today().isoformat()
    out = args.out or f"bench/results/mla_decode_{device.lower().replace(' ', '-')}_{date}.csv"
    with open(out, "w") as f:
        f.write(f"# {device}, {date}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
                f"flashgen {flashgen._lib.version()}\n")
        keys = list(rows[0].keys())
        f.write(",".join(keys) + "\n")
        for row in rows:
            f.write(",".join(str(row[k]) for k in keys) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
