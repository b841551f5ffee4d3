#!/usr/bin/env python3
"""Decoding against a KV cache: flashgen.torch.attention_with_kvcache (contiguous and paged caches) against SDPA's
FLASH_ATTENTION and CUDNN_ATTENTION backends on the same tensors, in one process. One new query token per
sequence over full caches of `keys` keys. Each implementation's calls are captured in a CUDA graph (as inference
servers run decoding) and replayed; every call reads another copy of the inputs, so the copies a graph walks
exceed the L2 cache several times and every K and V byte comes from HBM. Reports microseconds per call, the GB/s
of K and V read (each byte once: the bytes the problem holds, whatever a peer reads more) and its fraction of the
HBM bandwidth. The paged runs scatter each sequence's pages over the cache in a shuffled order. Every variant's
tensors are fresh allocations (a cache in reused blocks can lose the GPU's large TLB pages). Writes a CSV with
device, date and versions.

With --window L, every query sees its last L + 1 keys (window_size=(L, 0), gpt-oss's and Mistral's decode): the
SDPA backends take no window and are left out, the bytes counted are those of the window's keys, and as many copies
are made as put them past the L2 cache. --splits times flashgen with these key ranges per sequence (0: its own
choice) side by side. --cache-dtype e4m3 (or e5m2) times flashgen over FP8 caches too, quantized from the bf16 ones
with a scale per kv head: their rows count the FP8 bytes, and vs_bf16_cache gives the speed-up over flashgen's bf16
cache at the same point.

    python3 bench/bench_decode.py [--batch 1 8 32 64] [--keys 512 2048 8192 32768 131072] [--heads-kv 8]
                                  [--head-dim 128] [--pages 0 16 256] [--window L] [--splits 0 1 3]
                                  [--cache-dtype bf16 e4m3 e5m2] [--out FILE]
"""
import argparse
import datetime
import math

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashgen
import flashgen.torch as fg

HBM_BYTES_PER_S = {"H100": 3.35e12, "H200": 4.8e12}
L2_WALK_BYTES = 400 << 20  # bytes the copies of one graph span at least


def hbm_peak(device):
    for name, peak in HBM_BYTES_PER_S.items():
        if name in device:
            return peak
    return float("nan")


def graph_us(calls, replays=5):
    """Mean microseconds per call of the functions in calls, captured in one CUDA graph in order and replayed."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for call in calls[:2]:  # warm-up outside the capture: compiles, loads, picks kernels
            call()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) * 1000.0 / (replays * len(calls))


FP8_TYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def quantized(ks, vs, cache_dtype):
    """The copies' caches in cache_dtype with (k_scale, v_scale), a scale per kv head; bf16: as they are, None."""
    if cache_dtype == "bf16":
        return ks, vs, None
    fp8 = FP8_TYPES[cache_dtype]
    largest = torch.finfo(fp8).max

    def scale_of(t):
        return (t.abs().amax(dim=(0, 1, 3)).float() / largest).clamp_min(1e-12)

    scales = (scale_of(ks[0]), scale_of(vs[0]))

    def cast(t, s):
        return (t.float() / s[None, None, :, None]).clamp(-largest, largest).to(fp8)

    return [cast(k, scales[0]) for k in ks], [cast(v, scales[1]) for v in vs], scales


def sdpa_call(backend, q, k, v, group):
    """SDPA on one copy ([batch, heads, seq, head_dim] views of the bshd tensors), with its grouped heads if the
    backend takes them (enable_gqa), else on K and V expanded to every query head (read once per query head)."""
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    if group > 1:
        try:
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
            return (lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)), "gqa"
        except RuntimeError:
            kt, vt = (t.repeat_interleave(group, dim=1) for t in (kt, vt))
            return (lambda: F.scaled_dot_product_attention(qt, kt, vt)), "expanded"
    return (lambda: F.scaled_dot_product_attention(qt, kt, vt)), "mha"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--keys", type=int, nargs="+", default=[512, 2048, 8192, 32768, 131072])
    parser.add_argument("--heads-q", type=int, default=32)
    parser.add_argument("--heads-kv", type=int, nargs="+", default=[8])
    parser.add_argument("--head-dim", type=int, nargs="+", default=[128])
    parser.add_argument("--pages", type=int, nargs="+", default=[0, 16, 256], help="0: contiguous cache")
    parser.add_argument("--max-tokens", type=int, default=1 << 21, help="skip batch * keys above this")
    parser.add_argument("--peers", default="flash,cudnn")
    parser.add_argument("--window", type=int, default=-1, help="keys before the new token each query sees (-1: all)")
    parser.add_argument("--splits", type=int, nargs="+", default=[0], help="flashgen's num_splits (0: its choice)")
    parser.add_argument("--cache-dtype", nargs="+", default=["bf16"], choices=["bf16", "e4m3", "e5m2"],
                        help="flashgen's cache types (the peers read bf16)")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.window >= 0:
        args.peers = ""  # SDPA's backends take no window
    window = (args.window, 0) if args.window >= 0 else (-1, -1)

    device = torch.cuda.get_device_name()
    peak = hbm_peak(device)
    dtype = torch.bfloat16
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    peers = [p for p in args.peers.split(",") if p]
    rows = []
    print(f"{device}; HBM {peak / 1e12:.2f} TB/s; torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}")
    for d in args.head_dim:
        for hkv in args.heads_kv:
            group = args.heads_q // hkv
            for batch in args.batch:
                for keys in args.keys:
                    if batch * keys > args.max_tokens:
                        continue
                    visited = keys if args.window < 0 else min(keys, args.window + 1)
                    kv_bytes = 2 * batch * visited * hkv * d * 2
                    copies = max(1, min(16 if args.window < 0 else 256, math.ceil(L2_WALK_BYTES / kv_bytes)))
                    gen = torch.Generator(device="cuda").manual_seed(batch * 131 + keys)
                    qs = [torch.randn(batch, 1, args.heads_q, d, device="cuda", dtype=dtype, generator=gen)
                          for _ in range(copies)]
                    ks = [torch.randn(batch, keys, hkv, d, device="cuda", dtype=dtype, generator=gen)
                          for _ in range(copies)]
                    vs = [torch.randn(batch, keys, hkv, d, device="cuda", dtype=dtype, generator=gen)
                          for _ in range(copies)]
                    lens = torch.full((batch,), keys, dtype=torch.int32, device="cuda")
                    point = {"device": device, "batch": batch, "keys": keys, "window": args.window,
                             "heads_q": args.heads_q, "heads_kv": hkv, "head_dim": d, "kv_bytes": kv_bytes}
                    times = {}
                    for page, cache_dtype in [(p, c) for p in args.pages for c in args.cache_dtype]:
                        if page and keys % page:
                            continue
                        cache_ks, cache_vs, scales = quantized(ks, vs, cache_dtype)
                        if page:
                            # Each copy's cache as pages of `page` keys scattered in a shuffled order.
                            pages_per_seq = keys // page
                            order = torch.randperm(batch * pages_per_seq, device="cuda", generator=gen)
                            table = order.view(batch, pages_per_seq).to(torch.int32)
                            caches = []
                            for k, v in zip(cache_ks, cache_vs):
                                kp, vp = (torch.empty(batch * pages_per_seq, page, hkv, d, device="cuda", dtype=k.dtype)
                                          for _ in range(2))
                                kp[order] = k.reshape(batch * pages_per_seq, page, hkv, d)
                                vp[order] = v.reshape(batch * pages_per_seq, page, hkv, d)
                                caches.append((kp, vp))
                            cached = [(q, c[0], c[1], table) for q, c in zip(qs, caches)]
                            name = f"flashgen_paged{page}"
                        else:
                            cached = [(q, k, v, None) for q, k, v in zip(qs, cache_ks, cache_vs)]
                            name = "flashgen"
                        if cache_dtype != "bf16":
                            name += f"_{cache_dtype}"
                        scale_args = {} if scales is None else {"k_scale": scales[0], "v_scale": scales[1]}
                        for splits in args.splits:
                            calls = [lambda c=c, n=splits: fg.attention_with_kvcache(
                                c[0], c[1], c[2], cache_seqlens=lens, block_table=c[3], causal=True,
                                window_size=window, num_splits=n, **scale_args) for c in cached]
                            with torch.no_grad():
                                times[name + (f"_splits{splits}" if splits else "")] = (
                                    graph_us(calls), "", kv_bytes // (1 if cache_dtype == "bf16" else 2))
                        del cached, cache_ks, cache_vs
                        if page:
                            del caches
                        # Each variant's tensors in fresh allocations: a cache that reuses freed blocks of the
                        # one before can lose the GPU's large TLB pages and read up to 10% slower.
                        torch.cuda.empty_cache()
                    for peer in peers:
                        try:
                            with sdpa_kernel(backends[peer]), torch.no_grad():
                                made = [sdpa_call(backends[peer], q, k, v, group) for q, k, v in zip(qs, ks, vs)]
                                times[f"sdpa_{peer}"] = (graph_us([m[0] for m in made]), made[0][1], kv_bytes)
                        except RuntimeError as error:
                            print(f"  sdpa_{peer} failed: {str(error).splitlines()[0]}")
                    best_peer = min((t[0] for n, t in times.items() if n.startswith("sdpa")), default=float("nan"))
                    line = [f"b{batch:<3} k{keys:<6} gqa{group} d{d}:"]
                    for name, (us, how, nbytes) in times.items():
                        gbs = nbytes / (us * 1e-6) / 1e9
                        bf16_twin = name.replace("_e4m3", "").replace("_e5m2", "")
                        rows.append({**point, "kv_bytes": nbytes, "impl": name, "peer_heads": how, "us": f"{us:.2f}",
                                     "GBps": f"{gbs:.0f}", "hbm_fraction": f"{gbs * 1e9 / peak:.3f}",
                                     "vs_best_peer": f"{best_peer / us:.2f}" if name.startswith("flashgen") else "",
                                     "vs_bf16_cache": f"{times[bf16_twin][0] / us:.2f}"
                                     if name != bf16_twin and bf16_twin in times else ""})
                        line.append(f"{name} {us:.1f}us {gbs:.0f}GB/s")
                    print("  ".join(line), flush=True)
                    del qs, ks, vs
                    torch.cuda.empty_cache()

    date = datetime.date.today().isoformat()
    out = args.out or f"bench/results/decode_{device.lower().replace(' ', '-')}_{date}.csv"
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
