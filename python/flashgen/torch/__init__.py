"""flashgen for PyTorch: `attention(q, k, v, ...)`, softmax attention on CUDA fp16/bf16 tensors like
scaled_dot_product_attention, with autograd, grouped-query heads and both causal alignments (and on FP8 ones with
FlashAttention-3's descales, forward only); `varlen_attention` for packed batches and `attention_with_kvcache` for
decoding (FlashAttention's arguments), `mla_decode_with_kvcache` for MLA decoding over a latent cache (FlashMLA's
arguments); `explain` says which kernels a call runs and why; `tune`
sweeps the forward's configs for a problem; `enable()` makes unchanged torch.nn.functional.scaled_dot_product_attention
calls run flashgen. Two defaults differ from SDPA's: the layout is [batch, seqlen, heads, head_dim] (pass
layout="bhsd" for SDPA's [batch, heads, seqlen, head_dim]), and causal=True aligns the mask bottom-right (pass
causal_align="top_left" for SDPA's is_causal when seqlen_q != seqlen_k).

    import torch, flashgen.torch
    q, k, v = (torch.randn(2, 1024, 8, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    out = flashgen.torch.attention(q, k, v, causal=True)   # [batch, seqlen, heads, head_dim]
    out.sum().backward()

The passes are torch.library custom ops (flashgen::attention_forward, ...; _ops.py) with fake implementations, so
torch.compile keeps them in its graphs; eager calls on CUDA tensors do the ops' work without the dispatcher's round
trip (_autograd.py), and a warm call of a signature seen before reuses its ctypes arguments (_calls.py). Once their
kernels are loaded calls neither allocate outside torch's caching allocator nor synchronize, so they can be captured
in a CUDA graph. backend() says whether the ops run in C++ (libflashgen_torch.so, built with the wheel when torch's
headers are there) or in Python over ctypes.

The package's files, one concern each: _checks (argument checks), _calls and _kvcache_calls (the C calls over
tensors through ctypes), _native (the C++ op library), _schemas and _ops (the custom ops), _autograd, _dense, _varlen
and _kvcache (the public functions), _variants (user variants), _sdpa (the SDPA overrides).
"""

import torch

if not (hasattr(torch.library, "custom_op") and hasattr(torch.library, "register_autograd")):
    raise ImportError(f"flashgen.torch needs torch >= 2.4 (torch.library.custom_op); this is torch {torch.__version__}")

from .._lib import FlashgenArgumentError, FlashgenError  # noqa: E402
from . import _native, _ops  # noqa: E402,F401  (_ops defines the custom ops)
from ._dense import attention, explain, tune  # noqa: E402
from ._kvcache import attention_with_kvcache, mla_decode_with_kvcache  # noqa: E402
from ._sdpa import disable, enable, reset_sdpa_stats, sdpa_stats  # noqa: E402
from ._variants import BlockMask  # noqa: E402
from ._varlen import varlen_attention  # noqa: E402

__all__ = ["attention", "varlen_attention", "attention_with_kvcache", "mla_decode_with_kvcache", "explain", "tune",
           "enable", "disable", "sdpa_stats", "reset_sdpa_stats", "backend", "BlockMask", "FlashgenError",
           "FlashgenArgumentError"]


def backend(detail=False):
    """How flashgen.torch's ops run: "native" (libflashgen_torch.so, C++ kernels registered with torch's dispatcher on
    its stable ABI) or "ctypes" (the ops defined in Python, calling libflashgen's C ABI through ctypes). detail=True
    gives {"backend": ..., "library": the op library's path} or {"backend": "ctypes", "reason": why not native}, and
    where autograd and enable()'s SDPA overrides run: "autograd" and "sdpa" are "native" where the release library
    built for this torch release is loaded (libflashgen_torch-<release>.so, "release_library" its path), else
    "python" ("release_reason" why)."""
    name = "native" if _native.loaded() else "ctypes"
    if not detail:
        return name
    answer = {"backend": name, "library": _native._State.path} if name == "native" else {
        "backend": name, "reason": _native._State.reason}
    if _native.release_loaded():
        answer.update(autograd="native", sdpa="native", release_library=_native._State.release_path)
    else:
        answer.update(autograd="python", sdpa="python",
                      release_reason=_native._State.release_reason or "the op library is not loaded")
    return answer
