"""Host cost of a warm call through the PyTorch op against SDPA's FlashAttention-2 and cuDNN backends in the
same process: the median time from calling to return (the kernel queued) over many calls of a tiny problem,
the stream drained every 256 calls outside the timed region. Also the raw C ABI call through ctypes, and the
unchanged SDPA call served by flashgen (flashgen.torch.enable()).
    FLASHGEN_LIBRARY=build/libflashgen.so python bench/call_path.py [--calls N] [--csv FILE] [--first-call]
--first-call: in this fresh process, the time of torch's first CUDA work, then of flashgen's first call."""
import argparse
import datetime
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def per_call_us(fn, calls):
    samples = []
    for i in range(calls):
        if i % 256 == 0:
            torch.cuda.synchronize()
        start = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - start) / 1e3)
    torch.cuda.synchronize()
    samples.sort()
    return samples[len(samples) // 2], samples[len(samples) // 10], samples[(len(samples) * 9) // 10]


def first_call():
    start = time.perf_counter()
    q = torch.randn(1, 128, 1, 64, device="cuda", dtype=torch.float16)
    torch.cuda.synchronize()
    torch_ms = (time.perf_counter() - start) * 1e3
    start = time.perf_counter()
    import flashgen.torch as fg
    import_ms = (time.perf_counter() - start) * 1e3
    start = time.perf_counter()
    fg.attention(q, q, q, causal=True)
    torch.cuda.synchronize()
    first_ms = (time.perf_counter() - start) * 1e3
    start = time.perf_counter()
    fg.attention(q, q, q, causal=True)
    torch.cuda.synchronize()
    second_ms = (time.perf_counter() - start) * 1e3
    print(f"stage,ms\ntorch_first_cuda,{torch_ms:.3f}\nimport_flashgen_torch,{import_ms:.3f}\n"
          f"flashgen_first_call,{first_ms:.3f}\nflashgen_second_call,{second_ms:.3f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=10000)
    parser.add_argument("--csv")
    parser.add_argument("--first-call", action="store_true")
    args = parser.parse_args()
    if args.first_call:
        return first_call()
    import flashgen.torch as fg
    from flashgen import _lib
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 128, 1, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))  # SDPA's [batch, heads, seqlen, head_dim]
    rows = []

    def sdpa(backend):
        def call():
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
        return call

    def sdpa_outside(backend):
        ctx = sdpa_kernel(backend)
        ctx.__enter__()
        return lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)

    fg.attention(q, k, v, causal=True)
    out = torch.empty_like(q)
    lse = torch.empty(1, 1, 128, device="cuda", dtype=torch.float32)
    from flashgen.torch._calls import _view
    views = [_view(t, "bshd") for t in (q, k, v, out)]
    import ctypes
    options = _lib.AttentionOptions(0.0, _lib.MASK_CAUSAL, 0)
    forward = _lib.function("flashgen_attention_forward")
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    refs = [ctypes.byref(view) for view in views]
    lse_ptr = ctypes.c_void_p(lse.data_ptr())
    opts_ref = ctypes.byref(options)
    cases = [("flashgen.torch.attention", lambda: fg.attention(q, k, v, causal=True)),
             ("flashgen C ABI via ctypes", lambda: forward(*refs, lse_ptr, opts_ref, stream)),
             ("SDPA flash (FA2)", sdpa_outside(SDPBackend.FLASH_ATTENTION)),
             ("SDPA cuDNN", sdpa_outside(SDPBackend.CUDNN_ATTENTION))]
    for name, fn in cases:
        fn()
        median, p10, p90 = per_call_us(fn, args.calls)
        rows.append((name, median, p10, p90))
    # The same SDPA call, unchanged, once flashgen.torch.enable() serves it (backends as SDPA chooses them).
    sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                 SDPBackend.MATH]).__enter__()
    with fg.enable():
        fg.reset_sdpa_stats()
        call = lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)  # noqa: E731
        call()
        median, p10, p90 = per_call_us(call, args.calls)
        served = fg.sdpa_stats()["forward"]
        if served != {"flashgen": args.calls + 1}:
            raise SystemExit(f"the SDPA calls were not all served by flashgen: {served}")
        rows.append(("SDPA served by flashgen (enable())", median, p10, p90))
    device = torch.cuda.get_device_name()
    date = datetime.date.today().isoformat()
    lines = ["device,date,torch,flashgen,calls,call,median_us,p10_us,p90_us"]
    for name, median, p10, p90 in rows:
        lines.append(f"{device},{date},{torch.__version__},{_lib.version()},{args.calls},{name},{median:.2f},{p10:.2f},{p90:.2f}")
    text = "\n".join(lines) + "\n"
    if args.csv:
        open(args.csv, "w").write(text)
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
