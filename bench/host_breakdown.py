"""Warm host cost per call of each layer of a flashgen.torch call (attention() with and without autograd, the
autograd.Function alone, the op through the dispatcher, the backward, the ops called directly) against SDPA's cuDNN
backend: median of back-to-back calls (the stream drained every 200), d128 causal bf16, at B1x128 and B16x1k, and a
cProfile table of the tiny call's forward and backward. The backend is whichever flashgen.torch loads
(FLASHGEN_NATIVE_OPS=0: ctypes).
    FLASHGEN_LIBRARY=build/libflashgen.so PYTHONPATH=python python bench/host_breakdown.py
"""
import cProfile
import io
import pstats
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashgen.torch as fg
from flashgen.torch import _autograd


def per_call_us(fn, calls):
    """Median host time of fn() in µs over back-to-back calls, the stream drained every 200 calls (untimed)."""
    fn()
    torch.cuda.synchronize()
    samples = []
    for i in range(calls):
        if i % 200 == 0:
            torch.cuda.synchronize()
        start = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - start) / 1e3)
    torch.cuda.synchronize()
    return statistics.median(samples)


def layers(batch, seqlen, calls):
    """{layer: µs} at one shape."""
    q, k, v = (torch.randn(batch, seqlen, 16, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    qt, kt, vt = (torch.randn(batch, 16, seqlen, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                  for _ in range(3))
    dout, doutt = torch.randn_like(q), torch.randn_like(qt)
    forward_op = torch.ops.flashgen.attention_forward.default
    rows = {}
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        with torch.no_grad():
            rows["no grad, attention()"] = per_call_us(lambda: fg.attention(q, k, v, causal=True), calls)
            rows["no grad, the op directly"] = per_call_us(
                lambda: forward_op(q, k, v, 0.0, "bottom_right", "bshd", False), calls)
            rows["no grad, SDPA cuDNN"] = per_call_us(
                lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True), calls)
        rows["grad, attention()"] = per_call_us(lambda: fg.attention(q, k, v, causal=True), calls)
        rows["grad, _EagerAttention.apply"] = per_call_us(lambda: _autograd._EagerAttention.apply(
            q, k, v, 0.0, "bottom_right", "bshd", False, 0.0, -1, -1, None, None, 0), calls)
        rows["grad, the op through the dispatcher's autograd"] = per_call_us(
            lambda: forward_op(q, k, v, 0.0, "bottom_right", "bshd", False), calls)
        rows["grad, SDPA cuDNN"] = per_call_us(
            lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True), calls)
        out = fg.attention(q, k, v, causal=True)
        outt = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
        rows["backward (autograd.grad, graph kept)"] = per_call_us(
            lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), calls)
        rows["backward, SDPA cuDNN"] = per_call_us(
            lambda: torch.autograd.grad(outt, (qt, kt, vt), doutt, retain_graph=True), calls)
    plain = [t.detach() for t in (q, k, v)]
    lse = fg.attention(*plain, causal=True, return_lse=True)[1]
    rows["backward op directly"] = per_call_us(lambda: torch.ops.flashgen.attention_backward.default(
        dout, *plain, out.detach(), lse, 0.0, "bottom_right", "bshd", False), calls)
    return rows, (q, k, v, dout)


def main():
    print("backend", fg.backend())
    for batch, seqlen, calls in ((1, 128, 2000), (16, 1024, 300)):
        rows, (q, k, v, dout) = layers(batch, seqlen, calls)
        print(f"== B{batch}x{seqlen} d128 causal, median host µs per call (warm loop)")
        for name, us in rows.items():
            print(f"  {name:50s} {us:8.1f}")
        if seqlen == 128:
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(500):
                out = fg.attention(q, k, v, causal=True)
                torch.autograd.grad(out, (q, k, v), dout)
            profiler.disable()
            table = io.StringIO()
            pstats.Stats(profiler, stream=table).sort_stats("tottime").print_stats(18)
            print(table.getvalue())


if __name__ == "__main__":
    main()
