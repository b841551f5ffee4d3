#!/usr/bin/env python3
"""The FP8 backward (flashgen_attention_backward with e4m3 q, k and v and their descales, bf16 out, dout and
gradients) against flashgen's bf16 backward and cuDNN's bf16 backward (SDPA's cuDNN backend) on the same dequantized
values, interleaved in one process, L2 flushed before each sample. batch · seqlen = --tokens, heads · head_dim =
--width, as the FP8 anchors are measured. TFLOP/s over 2.5 × the forward's FLOPs (4 · b · h · s² · d, halved when
causal). Also prints how far the FP8 call's gradients are from the bf16 call's. Writes a CSV with device, date and
versions.

    python3 bench/bench_fp8_backward.py [--head-dims 64,128,256] [--seqlens 2048,4096,8192,16384] [--out FILE]
"""
import argparse
import ctypes
import datetime

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import bench_fwd  # its CSV writer
import flashgen
import flashgen.torch  # noqa: F401 (torch.ops.flashgen)
from flashgen import _lib

CODES = {torch.bfloat16: _lib.BFLOAT16, torch.float16: _lib.FLOAT16, torch.float8_e4m3fn: _lib.FLOAT8_E4M3,
         torch.float8_e5m2: _lib.FLOAT8_E5M2}


def tensor(t):
    """A BSHD torch tensor as a flashgen_tensor."""
    return _lib.Tensor(t.data_ptr(), CODES[t.dtype], tuple(t.shape), tuple(t.stride()))


def backward_call(q, k, v, out, dout, lse, dq, dk, dv, causal, descales=None):
    """flashgen_attention_backward of these tensors on the current stream, as a callable."""
    opts = _lib.AttentionOptions()
    opts.mask = _lib.MASK_CAUSAL if causal else _lib.MASK_NONE
    if descales is not None:  # [batch, heads_kv] each
        opts.q_descale, opts.k_descale, opts.v_descale = (d.data_ptr() for d in descales)
        for name in ("q_descale_stride", "k_descale_stride", "v_descale_stride"):
            setattr(opts, name, (ctypes.c_int64 * 2)(*descales[0].stride()))
    views = [tensor(t) for t in (q, k, v, out, dout, dq, dk, dv)]
    fn = _lib.function("flashgen_attention_backward")
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    return lambda: _lib.check(
        fn(*(ctypes.byref(t) for t in views[:5]), ctypes.c_void_p(lse.data_ptr()),
           *(ctypes.byref(t) for t in views[5:]), ctypes.byref(opts), stream), "flashgen_attention_backward")


def median_ms(fn, samples, flush):
    times = []
    for _ in range(samples):
        flush.zero_()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop))
    return sorted(times)[len(times) // 2]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--head-dims", default="64,128,256")
    parser.add_argument("--seqlens", default="2048,4096,8192,16384")
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--width", type=int, default=2048, help="heads * head_dim")
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--out")
    args = parser.parse_args()
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    device, today = torch.cuda.get_device_name(), datetime.date.today().isoformat()
    rows = []
    for head_dim in [int(x) for x in args.head_dims.split(",")]:
        heads = args.width // head_dim
        for seqlen in [int(x) for x in args.seqlens.split(",")]:
            batch = args.tokens // seqlen
            for causal in (False, True):
                torch.manual_seed(0)
                shape = (batch, seqlen, heads, head_dim)
                # Codes out to ±448 (e4m3's largest: torch gives NaN past it), descales per (batch entry, head)
                # bringing them to about 1.
                codes = [(torch.randn(shape, device="cuda") * 150).clamp(-448, 448).to(torch.float8_e4m3fn)
                         for _ in range(3)]
                descales = [torch.rand(batch, heads, device="cuda") * 0.004 + 0.006 for _ in range(3)]
                values = [(c.float() * d[:, None, :, None]).to(torch.bfloat16) for c, d in zip(codes, descales)]
                out, lse = torch.ops.flashgen.attention_forward(*values, 0.0, "bottom_right" if causal else "none",
                                                                "bshd", False)
                dout = torch.randn_like(out)
                grads8 = [torch.empty_like(t) for t in values]
                grads16 = [torch.empty_like(t) for t in values]
                fp8 = backward_call(*codes, out, dout, lse, *grads8, causal, descales)
                bf16 = backward_call(*values, out, dout, lse, *grads16, causal)
                fp8()
                bf16()
                torch.cuda.synchronize()
                difference = max(((a.float() - b.float()).abs().max() / b.float().abs().max()).item()
                                 for a, b in zip(grads8, grads16))
                sdpa_in = [t.detach().transpose(1, 2).requires_grad_() for t in values]
                with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                    sdpa_out = F.scaled_dot_product_attention(*sdpa_in, is_causal=causal)
                    sdpa_dout = dout.transpose(1, 2)
                    cudnn = lambda: torch.autograd.grad(sdpa_out, sdpa_in, sdpa_dout, retain_graph=True)
                    cudnn()
                ms = {"fp8": [], "bf16": [], "cudnn_bf16": []}
                for _ in range(3):  # interleaved rounds
                    ms["fp8"].append(median_ms(fp8, args.samples, flush))
                    ms["bf16"].append(median_ms(bf16, args.samples, flush))
                    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                        ms["cudnn_bf16"].append(median_ms(cudnn, args.samples, flush))
                flops = 2.5 * 4.0 * batch * heads * seqlen * seqlen * head_dim / (2 if causal else 1)
                best = {name: min(v) for name, v in ms.items()}
                tflops = {name: flops / t / 1e9 for name, t in best.items()}
                rows.append(dict(device=device, date=today, torch=torch.__version__,
                                 cudnn=torch.backends.cudnn.version(), flashgen=flashgen.version(), head_dim=head_dim,
                                 seqlen=seqlen, batch=batch, heads=heads, causal=int(causal),
                                 **{f"{n}_ms": best[n] for n in ms}, **{f"{n}_tflops": tflops[n] for n in ms},
                                 fp8_over_cudnn_bf16=tflops["fp8"] / tflops["cudnn_bf16"],
                                 fp8_vs_bf16_gradients=difference))
                print(f"d{head_dim} s{seqlen} b{batch} causal={int(causal)}: FP8 {tflops['fp8']:.0f}, bf16 "
                      f"{tflops['bf16']:.0f}, cuDNN bf16 {tflops['cudnn_bf16']:.0f} TFLOP/s; FP8 vs bf16 gradients "
                      f"{difference:.1e} of the largest", flush=True)
                del codes, values, grads8, grads16, sdpa_in, sdpa_out
    if args.out:
        bench_fwd.write_csv(args.out, list(rows[0]), rows)

if __name__ == "__main__":
    main()
