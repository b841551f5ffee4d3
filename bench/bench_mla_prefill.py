#!/usr/bin/env python3
"""MLA prefill benchmark, forward or (--backward) backward: queries and keys of head dim 192, values of 128
(DeepSeek-V3's "MHA mode"; any other pair with --head-dim and --head-dim-v, such as FA3's 64 / 512), flashgen (its C
ABI through ctypes, on the torch tensors) against PyTorch SDPA's cuDNN and memory-efficient backends and, with
--flex, FlexAttention (torch.compile'd), in one process, on the same random tensors. Writes a CSV and prints a
markdown table (the last thing printed).

Run on a GPU machine:  python3 bench/bench_mla_prefill.py [--lib build/libflashgen.so] [--quick] [--backward]
    python3 bench/bench_mla_prefill.py --head-dim 64 --head-dim-v 512 --heads 16 --flex --out FILE.csv
"""

import argparse
import ctypes
import datetime
import math
import os
import re
import sys

REPO_ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, REPO_ROOT)  # bench_fwd's timing and CSV helpers

from bench_fwd import Bench, fmt, slug, write_csv  # noqa: E402

CSV_COLUMNS = [
    "device", "date", "torch_version", "cuda_version", "cudnn_version", "flashgen_version",
    "pass", "dtype", "causal", "head_dim", "head_dim_v", "batch", "seqlen", "heads",
    "flashgen_ms", "flashgen_ms_p10", "flashgen_ms_p90", "flashgen_tflops", "flashgen_config",
    "cudnn_ms", "cudnn_tflops", "efficient_ms", "efficient_tflops", "flex_ms", "flex_tflops",
    "ratio_vs_cudnn", "ratio_vs_efficient", "ratio_vs_flex", "max_abs_diff", "error",
]


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Each point: batch = --tokens / seqlen; one checked flashgen call (its "
                                            "output against an fp32 slice of the reference: batch 0, heads 0-1), "
                                            "then --warmup untimed and --samples timed calls per implementation, "
                                            "L2 flushed before each (bench_fwd.py's Bench). FLOPs = 2 * batch * "
                                            "heads * seqlen^2 * (head_dim + head_dim_v), halved when causal, 2.5 "
                                            "times that for the backward (whose check covers dq, dk and dv of the "
                                            "slice; the peers' backward is timed on a kept graph, without the "
                                            "forward). A peer that raises for a point leaves its cells empty.")
    parser.add_argument("--lib", default=None, help="libflashgen.so (default: the package's own search)")
    parser.add_argument("--out", default=None,
                        help="CSV path (default: bench/results/mla_prefill_<device-slug>_<YYYY-MM-DD>.csv)")
    parser.add_argument("--dtype", default="bf16", choices=["fp16", "bf16"])
    parser.add_argument("--head-dim", type=int, default=192)
    parser.add_argument("--head-dim-v", type=int, default=128)
    parser.add_argument("--heads", default="16,128", help="comma-separated query (= key) heads (default: %(default)s)")
    parser.add_argument("--seqlens", default="1024,2048,4096,8192,16384")
    parser.add_argument("--tokens", type=int, default=16384, help="batch * seqlen of every point (default: %(default)s)")
    parser.add_argument("--causal", default="off,on")
    parser.add_argument("--quick", action="store_true", help="seqlens 2048 and 8192 only")
    parser.add_argument("--backward", action="store_true", help="time the backward (dq, dk, dv) instead")
    parser.add_argument("--deterministic", action="store_true", help="with --backward: flashgen's deterministic dQ")
    parser.add_argument("--flex", action="store_true", help="time FlexAttention too (compiled once per shape)")
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--flush-mb", type=int, default=256)
    parser.add_argument("--tol", type=float, default=None, help="max |flashgen - fp32 slice| (default: 2e-2 fp16, 5e-2 bf16)")
    args = parser.parse_args()
    args.heads = [int(h) for h in args.heads.split(",")]
    args.seqlens = [2048, 8192] if args.quick else [int(s) for s in args.seqlens.split(",")]
    args.causal = [c.strip() == "on" for c in args.causal.split(",")]
    return args


def main():
    args = parse_args()
    if args.lib is not None:
        os.environ["FLASHGEN_LIBRARY"] = os.path.abspath(args.lib)
    sys.path.insert(0, os.path.join(os.path.dirname(REPO_ROOT), "python"))
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    if args.flex:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        flex = torch.compile(flex_attention, dynamic=False)
    from flashgen import _lib

    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    code = {"fp16": 0, "bf16": 1}[args.dtype]
    tol = args.tol if args.tol is not None else {"fp16": 2e-2, "bf16": 5e-2}[args.dtype]
    forward = _lib.function("flashgen_attention_forward")
    backward = _lib.function("flashgen_attention_backward")
    bench = Bench(args, torch)
    device = torch.cuda.get_device_name()
    date = datetime.date.today().isoformat()
    versions = {"device": device, "date": date, "torch_version": torch.__version__,
                "cuda_version": torch.version.cuda, "cudnn_version": str(torch.backends.cudnn.version()),
                "flashgen_version": _lib.version()}

    def view(t):  # a BSHD torch tensor as flashgen_tensor
        return _lib.Tensor(t.data_ptr(), code, (ctypes.c_int64 * 4)(*t.shape), (ctypes.c_int64 * 4)(*t.stride()))

    rows = []
    for heads in args.heads:
        for seqlen in args.seqlens:
            batch = max(1, args.tokens // seqlen)
            for causal in args.causal:
                row = dict(versions, dtype=args.dtype, **{"pass": "backward" if args.backward else "forward"}, causal=int(causal), head_dim=args.head_dim,
                           head_dim_v=args.head_dim_v, batch=batch, seqlen=seqlen, heads=heads)
                torch.manual_seed(seqlen * 131 + heads)
                q = torch.randn(batch, seqlen, heads, args.head_dim, dtype=dtype, device="cuda")
                k = torch.randn(batch, seqlen, heads, args.head_dim, dtype=dtype, device="cuda")
                v = torch.randn(batch, seqlen, heads, args.head_dim_v, dtype=dtype, device="cuda")
                out = torch.empty(batch, seqlen, heads, args.head_dim_v, dtype=dtype, device="cuda")
                lse = torch.empty(batch, heads, seqlen, dtype=torch.float32, device="cuda")
                dout = torch.randn(batch, seqlen, heads, args.head_dim_v, dtype=dtype, device="cuda")
                grads = [torch.empty_like(t) for t in (q, k, v)]
                options = _lib.AttentionOptions()
                options.mask = 1 if causal else 0
                options.deterministic = int(args.deterministic)
                views = [view(t) for t in (q, k, v, out)]
                grad_views = [view(t) for t in [dout, *grads]]
                stream = torch.cuda.current_stream().cuda_stream

                def run_forward():
                    status = forward(*(ctypes.byref(x) for x in views), ctypes.c_void_p(lse.data_ptr()),
                                     ctypes.byref(options), ctypes.c_void_p(stream))
                    if status != 0:
                        raise RuntimeError(_lib.last_error())

                def run_backward():
                    status = backward(*(ctypes.byref(x) for x in views), ctypes.byref(grad_views[0]),
                                      ctypes.c_void_p(lse.data_ptr()), *(ctypes.byref(x) for x in grad_views[1:]),
                                      ctypes.byref(options), ctypes.c_void_p(stream))
                    if status != 0:
                        raise RuntimeError(_lib.last_error())

                flops = 2.0 * batch * heads * seqlen * seqlen * (args.head_dim + args.head_dim_v) / (2 if causal else 1)
                if args.backward:
                    flops *= 2.5
                try:
                    out.fill_(float("nan"))
                    run_forward()
                    if args.backward:
                        for g in grads:
                            g.fill_(float("nan"))
                        run_backward()
                    torch.cuda.synchronize()
                    # The fp32 reference of batch 0, heads 0-1 (every head has its own key/value head).
                    qs, ks, vs = (t[:1, :, :2].transpose(1, 2).float().requires_grad_(True) for t in (q, k, v))
                    scores = (qs @ ks.transpose(-1, -2)) / math.sqrt(args.head_dim)
                    if causal:
                        hide = torch.ones(seqlen, seqlen, dtype=torch.bool, device="cuda").triu(1)
                        scores = scores.masked_fill(hide, float("-inf"))
                    want = (torch.softmax(scores, dim=-1) @ vs).transpose(1, 2)
                    pairs = [(out[:1, :, :2], want)]
                    if args.backward:
                        want.backward(dout[:1, :, :2].float())
                        pairs += [(g[:1, :, :2], r.grad.transpose(1, 2)) for g, r in zip(grads, (qs, ks, vs))]
                    diff = max((got.float() - ref).abs().max().item() / max(ref.abs().max().item(), 1.0)
                               for got, ref in pairs)
                    row["max_abs_diff"] = diff
                    if not diff <= tol:
                        raise RuntimeError(f"max |flashgen - reference| / max(|reference|, 1) = {diff:.3g} > {tol:g}")
                    median, p10, p90 = bench.time_ms(run_backward if args.backward else run_forward)
                    row.update(flashgen_ms=median, flashgen_ms_p10=p10, flashgen_ms_p90=p90,
                               flashgen_tflops=flops / median / 1e9)
                    explain = "flashgen_explain_backward" if args.backward else "flashgen_explain_forward"
                    explained = ([*views, grad_views[0], ctypes.c_void_p(lse.data_ptr()), *grad_views[1:]]
                                 if args.backward else [*views, ctypes.c_void_p(lse.data_ptr())])
                    row["flashgen_config"] = _lib.call_json(
                        explain, *(x if isinstance(x, ctypes.c_void_p) else ctypes.byref(x) for x in explained),
                        ctypes.byref(options), ctypes.c_void_p(stream))["config"]
                except Exception as e:  # noqa: BLE001 (a failed point is reported in its row)
                    row["error"] = str(e).splitlines()[0][:200]
                qt, kt, vt = (t.transpose(1, 2).detach().requires_grad_(args.backward) for t in (q, k, v))
                peers = [("cudnn", SDPBackend.CUDNN_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION)]
                if args.flex:
                    peers.append(("flex", None))
                for name, backend in peers:
                    try:
                        if backend is None:
                            block_mask = (create_block_mask(lambda b, h, i, j: i >= j, None, None, seqlen, seqlen)
                                          if causal else None)

                            def attend():
                                return flex(qt, kt, vt, block_mask=block_mask)
                        else:
                            def attend():
                                with sdpa_kernel(backend):
                                    return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                        peer_out = attend()
                        peer_dout = dout.transpose(1, 2)

                        def run_peer():
                            if args.backward:
                                torch.autograd.grad(peer_out, (qt, kt, vt), peer_dout, retain_graph=True)
                            else:
                                attend()

                        median, _, _ = bench.time_ms(run_peer)
                        del peer_out
                        row[f"{name}_ms"] = median
                        row[f"{name}_tflops"] = flops / median / 1e9
                        if row.get("flashgen_ms"):
                            row[f"ratio_vs_{name}"] = median / row["flashgen_ms"]
                    except Exception as e:  # noqa: BLE001
                        print(f"# {name} at heads {heads} seqlen {seqlen} causal {causal}: "
                              f"{str(e).splitlines()[0][:160]}", file=sys.stderr)
                del q, k, v, out, lse, dout, grads
                torch.cuda.empty_cache()
                rows.append(row)
                print(f"# heads {heads} seqlen {seqlen} causal {int(causal)}: flashgen {fmt(row.get('flashgen_tflops'))} "
                      f"cudnn {fmt(row.get('cudnn_tflops'))} efficient {fmt(row.get('efficient_tflops'))} "
                      f"flex {fmt(row.get('flex_tflops'))} TFLOP/s "
                      f"{row.get('error', '')}", flush=True)

    kind = "mla_prefill_bwd" if args.backward else "mla_prefill"
    out_path = args.out or os.path.join(REPO_ROOT, "results", f"{kind}_{slug(device)}_{date}.csv")
    write_csv(out_path, CSV_COLUMNS, rows)
    print(f"wrote {out_path}\n")
    print(f"{device}, {args.dtype}, head_dim {args.head_dim}/{args.head_dim_v}, {'backward' if args.backward else 'forward'}"
          f", TFLOP/s (ratio = peer ms / flashgen ms)\n")
    print("| heads | seqlen | causal | flashgen | cuDNN | efficient | flex | vs cuDNN | vs efficient | vs flex | config |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['heads']} | {r['seqlen']} | {'yes' if r['causal'] else 'no'} | {fmt(r.get('flashgen_tflops'))} | "
              f"{fmt(r.get('cudnn_tflops'))} | {fmt(r.get('efficient_tflops'))} | {fmt(r.get('flex_tflops'))} | "
              f"{fmt(r.get('ratio_vs_cudnn'), 3)} | {fmt(r.get('ratio_vs_efficient'), 3)} | "
              f"{fmt(r.get('ratio_vs_flex'), 3)} | {r.get('flashgen_config', r.get('error', ''))} |")
    return 1 if any(r.get("error") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
