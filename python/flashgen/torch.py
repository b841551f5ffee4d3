"""flashgen for PyTorch: `attention(q, k, v, ...)`, softmax attention on CUDA fp16/bf16 tensors like
scaled_dot_product_attention, with autograd, grouped-query heads and both causal alignments; `explain` says which
kernels a call runs and why; `tune` sweeps the forward's configs for a problem. Two defaults differ from SDPA's:
the layout is [batch, seqlen, heads, head_dim] (pass layout="bhsd" for SDPA's [batch, heads, seqlen, head_dim]),
and causal=True aligns the mask bottom-right (pass causal_align="top_left" for SDPA's is_causal when seqlen_q !=
seqlen_k). Both passes are torch.library custom ops (flashgen::attention_forward, flashgen::attention_backward)
with fake implementations, so torch.compile keeps them in its graphs; eager calls on CUDA tensors do the ops'
work without the dispatcher's round trip (an autograd.Function: tens of microseconds less per call), and a warm
call of a signature seen before reuses its ctypes arguments (_ForwardPlan). Once their kernels are loaded a call
neither allocates outside torch's caching allocator nor synchronizes, so it can be captured in a CUDA graph.
`enable()` makes unchanged torch.nn.functional.scaled_dot_product_attention calls run flashgen (_sdpa.py).

    import torch, flashgen.torch
    q, k, v = (torch.randn(2, 1024, 8, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    out = flashgen.torch.attention(q, k, v, causal=True)   # [batch, seqlen, heads, head_dim]
    out.sum().backward()
"""

import ctypes
from typing import Optional

import torch

from . import _lib
from ._calls import (_DTYPE_CODES, _MASK_CODES, _NO_WINDOW, _BackwardCall, _ForwardCall, _Plans, _backward_kernels,
                     _bad, _bshd_shape, _check_alibi, _check_chunk, _check_inputs, _check_qkv, _check_scale,
                     _check_sinks, _check_softcap, _current_device, _dsinks, _forward, _layout_key, _lse_shape, _mask,
                     _mask_and_window, _options, _plannable_extras, _planned_forward, _plans, _readable, _stream,
                     _stream_handle, _strides_readable, _varlen_backward, _varlen_forward, _view, _warm_sinks)
from ._lib import FlashgenArgumentError, FlashgenError
from ._variants import BlockMask, user_variant

try:  # read once here, not at every call
    from torch.utils._python_dispatch import _get_current_dispatch_mode
except ImportError:
    _get_current_dispatch_mode = None

if not (hasattr(torch.library, "custom_op") and hasattr(torch.library, "register_autograd")):
    raise ImportError(f"flashgen.torch needs torch >= 2.4 (torch.library.custom_op); this is torch {torch.__version__}")

__all__ = ["attention", "varlen_attention", "attention_with_kvcache", "explain", "tune", "enable", "disable",
           "sdpa_stats", "reset_sdpa_stats", "BlockMask", "FlashgenError", "FlashgenArgumentError"]



# ---------------------------------------------------------------------------------------------------------
# The custom ops. scale 0.0 means 1/sqrt(head_dim); mask is "none", "bottom_right", "top_left" or "window"; layout
# is "bshd" or "bhsd"; softcap 0.0 means no soft cap; window_left and window_right are the window's sides (mask
# "window" only; -1 for no bound); alibi_slopes None or the ALiBi slopes; sinks None or the attention sinks (fp32
# [heads_q]); attention_chunk 0 or the chunk's length (any mask but "top_left"). Each newer argument was added last,
# so that older positional calls still bind. Outputs are new contiguous tensors in the inputs' layout; lse is fp32
# [batch, heads_q, seqlen_q] in either layout; the backward ops' fourth output is dsinks (_dsinks). The Python side
# passes the window as a (left, right) pair.



@torch.library.custom_op("flashgen::attention_forward", mutates_args=())
def _attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, mask: str, layout: str,
                       deterministic: bool, softcap: float = 0.0, window_left: int = -1,
                       window_right: int = -1, alibi_slopes: Optional[torch.Tensor] = None,
                       sinks: Optional[torch.Tensor] = None,
                       attention_chunk: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse). deterministic is not used by the forward; autograd hands it to the backward."""
    return _forward(q, k, v, scale, mask, layout, softcap=softcap, window=(window_left, window_right),
                    alibi_slopes=alibi_slopes, sinks=sinks, attention_chunk=attention_chunk)


@_attention_forward.register_fake
def _attention_forward_fake(q, k, v, scale, mask, layout, deterministic, softcap=0.0, window_left=-1,
                            window_right=-1, alibi_slopes=None, sinks=None, attention_chunk=0):
    _check_inputs(q, k, v, layout)
    return q.new_empty(q.shape), q.new_empty(_lse_shape(q, layout), dtype=torch.float32)




@torch.library.custom_op("flashgen::attention_backward", mutates_args=())
def _attention_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                        lse: torch.Tensor, scale: float, mask: str, layout: str, deterministic: bool,
                        softcap: float = 0.0, window_left: int = -1, window_right: int = -1,
                        alibi_slopes: Optional[torch.Tensor] = None, sinks: Optional[torch.Tensor] = None,
                        attention_chunk: int = 0
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dsinks) given dout and the forward's q, k, v, out and lse; dsinks is fp32 [heads_q] with sinks,
    else empty [0]."""
    return _backward_kernels(dout, q, k, v, out, lse, scale, mask, layout, deterministic, softcap,
                             (window_left, window_right), alibi_slopes, sinks, attention_chunk)


@_attention_backward.register_fake
def _attention_backward_fake(dout, q, k, v, out, lse, scale, mask, layout, deterministic, softcap=0.0,
                             window_left=-1, window_right=-1, alibi_slopes=None, sinks=None, attention_chunk=0):
    _check_inputs(q, k, v, layout)
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            _dsinks(q, _lse_shape(q, layout)[1], sinks))


def _setup_context(ctx, inputs, output):
    q, k, v, scale, mask, layout, deterministic = inputs[:7]
    out, lse = output
    # With the ALiBi slopes and the sinks (the backward reads both).
    ctx.save_for_backward(q, k, v, out, lse, *(inputs[i] if len(inputs) > i else None for i in (10, 11)))
    ctx.scale, ctx.mask, ctx.layout, ctx.deterministic = scale, mask, layout, deterministic
    ctx.softcap = inputs[7] if len(inputs) > 7 else 0.0
    ctx.window = tuple(inputs[8:10]) if len(inputs) > 9 else _NO_WINDOW
    ctx.attention_chunk = inputs[12] if len(inputs) > 12 else 0
    # The kernels compute no gradient through lse: it is returned for inspection and combining partial results.
    ctx.mark_non_differentiable(lse)
    ctx.set_materialize_grads(False)


def _backward(ctx, dout, dlse):
    if dout is None:  # out took no part in the loss
        return (None,) * 13
    q, k, v, out, lse, alibi_slopes, sinks = ctx.saved_tensors
    dq, dk, dv, dsinks = torch.ops.flashgen.attention_backward(dout, q, k, v, out, lse, ctx.scale, ctx.mask,
                                                               ctx.layout, ctx.deterministic, ctx.softcap,
                                                               *ctx.window, alibi_slopes, sinks, ctx.attention_chunk)
    # None for the slopes (a fixed bias); the sinks' gradient when there are sinks; None for the chunk.
    return (dq, dk, dv) + (None,) * 8 + (dsinks if sinks is not None else None, None)


_attention_forward.register_autograd(_backward, setup_context=_setup_context)


class _EagerAttention(torch.autograd.Function):
    """The custom ops' work for eager calls on plain CUDA tensors, without the dispatcher: a custom op's eager
    call costs about 80 µs of Python in torch.library per call, and a process's first one several seconds of
    torch imports (torch._dynamo, sympy, torch.distributed). Same kernels, same arguments, same autograd
    (the ops' _setup_context and _backward); under torch.compile, fake tensors and dispatch modes the ops
    run instead (_eager_call). forward takes ctx itself: with a separate setup_context, Function.apply binds
    its arguments through inspect.signature at every call."""

    @staticmethod
    def forward(ctx, q, k, v, scale, mask, layout, deterministic, softcap, window_left, window_right, alibi_slopes,
                sinks, attention_chunk):
        output = _forward(q, k, v, scale, mask, layout, checked=True, softcap=softcap,
                          window=(window_left, window_right), alibi_slopes=alibi_slopes, sinks=sinks,
                          attention_chunk=attention_chunk)
        _setup_context(ctx, (q, k, v, scale, mask, layout, deterministic, softcap, window_left, window_right,
                             alibi_slopes, sinks, attention_chunk), output)
        return output

    @staticmethod
    def backward(ctx, dout, dlse):
        if dout is None:  # out took no part in the loss
            return (None,) * 13
        q, k, v, out, lse, alibi_slopes, sinks = ctx.saved_tensors
        dq, dk, dv, dsinks = _backward_kernels(dout, q, k, v, out, lse, ctx.scale, ctx.mask, ctx.layout,
                                               ctx.deterministic, ctx.softcap, ctx.window, alibi_slopes, sinks,
                                               ctx.attention_chunk)
        return (dq, dk, dv) + (None,) * 8 + (dsinks if sinks is not None else None, None)


def _eager_call(*tensors):
    """Whether a call may skip the dispatcher (_EagerAttention): plain CUDA tensors, outside torch.compile's
    tracing and any dispatch mode."""
    if torch.compiler.is_compiling() or _current_dispatch_mode() is not None:
        return False
    return all(type(t) is torch.Tensor and t.is_cuda for t in tensors)


def _current_dispatch_mode():
    """The innermost active dispatch mode, or None; True when this torch cannot say (every call then goes
    through the ops)."""
    return True if _get_current_dispatch_mode is None else _get_current_dispatch_mode()


class _Empty(torch.autograd.Function):
    """attention() where q or k has no elements, without a kernel (the library takes sizes of at least 1): out 0
    (there is no row, or no row sees a key), lse -inf (each head's sink, with sinks) and zero gradients (the sinks'
    too: out does not depend on them)."""

    @staticmethod
    def forward(ctx, q, k, v, lse_shape, sinks=None):
        ctx.like = [(t.shape, t.dtype, t.device) for t in (q, k, v) + ((sinks,) if sinks is not None else ())]
        lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
        if sinks is None:
            lse.fill_(float("-inf"))
        else:  # [heads_q] broadcast over batch and rows
            lse.copy_(sinks[None, :, None])
        ctx.mark_non_differentiable(lse)
        return torch.zeros(q.shape, dtype=q.dtype, device=q.device), lse

    @staticmethod
    def backward(ctx, dout, dlse):
        dq, dk, dv, *dsinks = (torch.zeros(shape, dtype=dtype, device=device) for shape, dtype, device in ctx.like)
        return dq, dk, dv, None, dsinks[0] if dsinks else None


def _autocast(q, k, v):
    """Under torch.autocast on CUDA, inputs of another floating dtype than autocast's (float32 say) are cast to
    it, as scaled_dot_product_attention's are; outside it the inputs as given (float32 is then refused)."""
    try:
        enabled, dtype = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    except (TypeError, AttributeError):  # torch 2.4's older spellings
        enabled, dtype = torch.is_autocast_enabled(), torch.get_autocast_gpu_dtype()
    if not enabled or dtype not in _DTYPE_CODES:
        return q, k, v
    return tuple(t.to(dtype) if isinstance(t, torch.Tensor) and t.device.type == "cuda" and t.is_floating_point()
                 and t.dtype != dtype else t for t in (q, k, v))


class _UserVariantAttention(torch.autograd.Function):
    """A call with a user variant (_variants.py): run_forward(q, k, v, sinks) gives (out, lse), run_backward(dout, q, k,
    v, out, lse, sinks) the gradients (dq, dk, dv, dsinks), each a closure over the call's other arguments and its
    variant (whose buffers it keeps alive). Eager only: torch.compile leaves these calls out of its graphs."""

    @staticmethod
    def forward(ctx, run_forward, run_backward, q, k, v, sinks):
        out, lse = run_forward(q, k, v, sinks)
        ctx.save_for_backward(q, k, v, out, lse, sinks)
        ctx.run_backward = run_backward
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        if dout is None:
            return (None,) * 6
        q, k, v, out, lse, sinks = ctx.saved_tensors
        dq, dk, dv, dsinks = ctx.run_backward(dout, q, k, v, out, lse, sinks)
        return None, None, dq, dk, dv, dsinks if sinks is not None else None


@torch.compiler.disable
def _user_variant_call(run_forward, run_backward, q, k, v, sinks):
    """(out, lse) of a call with a user variant, through autograd when a gradient is wanted."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, sinks)):
        return _UserVariantAttention.apply(run_forward, run_backward, q, k, v, sinks)
    return run_forward(q, k, v, sinks)


def _deterministic(deterministic):
    """The backward's strategy: deterministic when asked for, or while torch.use_deterministic_algorithms(True)."""
    return bool(deterministic) or torch.are_deterministic_algorithms_enabled()


# ---------------------------------------------------------------------------------------------------------
# Public API.

def attention(q, k, v, *, causal=False, causal_align="bottom_right", scale=None, layout="bshd", deterministic=False,
              return_lse=False, softcap=0.0, window_size=(-1, -1), attention_chunk=0, alibi_slopes=None, sinks=None,
              mask_mod=None, score_mod=None, score_grad=None, score_bias=None, variant_helpers=None,
              variant_args=None, mask_same_for_heads=False, block_mask=None):
    """softmax(q kᵀ · scale [causal mask]) v on CUDA float16 / bfloat16 tensors, differentiable in q, k and v (and
    the attention sinks).

    q: [batch, seqlen_q, heads_q, head_dim] ("bshd") or [batch, heads_q, seqlen_q, head_dim] ("bhsd", the layout
    of torch's scaled_dot_product_attention). k, v: the same with seqlen_k and heads_kv; heads_q must be a
    multiple of heads_kv (grouped-query attention: query head h reads key/value head h // (heads_q // heads_kv)).
    head_dim a multiple of 8 up to 256. Any strides work without a copy as long as head_dim is contiguous, the
    other strides are multiples of 8 elements and the data 16-byte aligned; other inputs are copied first.

    causal: mask future keys. causal_align: "bottom_right" (key j visible to query i iff j <= i + seqlen_k -
    seqlen_q; the last query sees every key, as in decoding with a KV cache) or "top_left" (iff j <= i, what
    scaled_dot_product_attention's is_causal means). They differ only when seqlen_q != seqlen_k. A query row
    that sees no key (bottom_right with seqlen_q > seqlen_k) gets output 0, lse -inf (its head's sink, with sinks)
    and zero gradients.
    scale: the softmax scale, default 1/sqrt(head_dim). deterministic: the backward computes dq without
    atomics, giving bitwise-identical gradients on repeated runs (somewhat slower); also on while
    torch.use_deterministic_algorithms(True) is in effect. Empty inputs (a size 0) give empty or zero outputs,
    lse -inf and zero gradients. Under torch.autocast("cuda"), inputs of another floating dtype (float32) are
    cast to autocast's float16 or bfloat16 first, as scaled_dot_product_attention's are. softcap > 0 caps each
    score s = q·k · scale to softcap · tanh(s / softcap) before the softmax (Gemma 2's attention logit soft cap,
    FlashAttention's softcap), its derivative included in the backward; 0.0 (the default) leaves scores as they are.
    window_size=(left, right): a sliding window, FlashAttention's: query i sees keys i + seqlen_k - seqlen_q - left
    to i + seqlen_k - seqlen_q + right (aligned bottom-right), -1 for no bound on a side; with causal=True the right
    side is 0 (a causal window, Mistral's); (-1, -1), the default, is no window. Rows whose window holds no key get
    output 0, lse -inf and zero gradients. A window does not take causal_align="top_left". attention_chunk=C > 0:
    chunked attention (Llama 4's attention_chunk, FlashAttention-3's): query i sees only the keys j of its own chunk
    of C positions, j // C == (i + seqlen_k - seqlen_q) // C (floor division, aligned bottom-right: the rows
    i < seqlen_q - seqlen_k see no key), on top of the mask: with causal=True chunked causal attention (Llama 4's),
    without it bidirectional attention within each chunk, or a window_size window within it; 0, the default, is
    none. A chunk does not take causal_align="top_left". alibi_slopes: ALiBi (BLOOM, MPT), FlashAttention's: a
    float32 tensor [heads_q] or [batch, heads_q] on q's device, and the score of query i and key j (after the soft
    cap) gains -slope · |i + seqlen_k - seqlen_q - j| (|i - j| under causal_align="top_left"); no gradient flows to
    the slopes. sinks: attention sinks (gpt-oss), a tensor [heads_q] on q's device, float32 (bfloat16 and float16 ones,
    gpt-oss's parameter, are converted and their gradient flows back in their dtype): one logit per query head, in the
    units of the scaled scores, that joins every row's softmax denominator with no value, out_i = Σ_j e^(s_ij) v_j /
    (e^sink + Σ_j e^(s_ij)); lse includes it, a row that sees no key gets out 0 and lse = sink, and -inf for a head is
    no sink there. Sinks that require grad get their gradient, summed over the batch and every row.

    A user-defined variant, FlexAttention's mask_mod and score_mod as C++ device code compiled into the kernels
    (flashgen.h's flashgen_variant_desc): each a string holding a function body that ends in a return, seeing
    batch, head (the query head), q_idx, kv_idx (positions in the sequence, any in [0, seqlen_q) x [0, seqlen_k), those
    that causal, window_size or attention_chunk hide too), and the names of variant_args.
    mask_mod: `bool mask_mod(batch, head, q_idx, kv_idx)`, false hides the key, on top of causal, window_size and
    attention_chunk (a row that sees no key gets out 0, lse -inf). score_mod: `float score_mod(float score, batch,
    head, q_idx, kv_idx)` on the scaled score; its backward needs score_grad, `float score_grad(float modified, batch,
    head, q_idx, kv_idx)`, d score_mod / d score in terms of score_mod's value. score_bias: `float score_bias(batch,
    head, q_idx, kv_idx)` added to the score (its gradient derived). Not score_mod with score_bias, nor either with
    softcap or alibi_slopes (write those into it). variant_helpers: C++ at namespace scope the bodies may call.
    variant_args: {name: value}, a tensor on q's device (float32, int32, int64, uint8 or bool: `const float* name`,
    `const int*`, `const long long*`, `const unsigned char*`) or a Python int (int32) or float (float32). Each
    distinct set of bodies and argument names and types compiles once per process (a C++ error raises FlashgenError
    with NVRTC's messages at the body's own lines); the tensors and numbers may change from call to call. Such
    calls run eagerly (torch.compile leaves them out of its graphs). Each pass classifies the mask's blocks first
    (small kernels per call) and skips those with no visible key: per head, or once per batch entry with
    mask_same_for_heads=True, which a mask_mod that ignores head may set (the backward skips fewer for a mask whose
    visible blocks do not grow with the row). block_mask=flashgen.torch.BlockMask(): classes kept across calls, as
    FlexAttention's block mask: the calls of one step that share it (a model's layers, with the same mask_mod and
    variant_args) classify once per shape and pass; make a new one when variant_args' tensors change contents.

        doc = torch.tensor(document_ids, dtype=torch.int32, device="cuda")
        out = flashgen.torch.attention(q, k, v, causal=True, mask_mod="return doc[q_idx] == doc[kv_idx];",
                                       variant_args={"doc": doc})

    Returns out, shaped and laid out like q (a new contiguous tensor), or (out, lse) with return_lse, lse being
    the natural-log log-sum-exp of each row's scaled scores (and its sink), float32 [batch, heads_q, seqlen_q]; lse
    carries no gradient. Runs on the current CUDA stream of q's device. Bad arguments raise FlashgenArgumentError (a
    ValueError), other failures FlashgenError (a RuntimeError), carrying the library's message.
    """
    mask, window = _mask_and_window(causal, causal_align, window_size)
    chunk = _check_chunk(attention_chunk, mask)
    q, k, v = _autocast(q, k, v)
    scale = _check_scale(scale)
    softcap = _check_softcap(softcap)
    if (mask_mod is None and score_mod is None and score_bias is None and _eager_call(q, k, v)
            and all(t is None or isinstance(t, torch.Tensor) for t in (alibi_slopes, sinks))
            and not (torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, sinks)))):
        # The warm call of a signature seen before: its plan's key holds all that _check_inputs looks at (and the
        # slopes' and sinks' layout).
        planned = _planned_forward(q, k, v, scale, mask, layout, softcap, window, chunk, False, create=False,
                                   want_lse=return_lse, alibi_slopes=alibi_slopes, sinks=_warm_sinks(sinks))
        if planned is not None:
            return planned if return_lse else planned[0]
    _check_inputs(q, k, v, layout)
    batch, heads_q, _ = _lse_shape(q, layout)
    alibi_slopes = _check_alibi(alibi_slopes, q.device, batch, heads_q)
    sinks = _check_sinks(sinks, q.device, heads_q)  # float32 here, so autograd converts the gradient back
    user = user_variant(q.device, mask_mod, score_mod, score_grad, score_bias, variant_helpers, variant_args,
                        mask_same_for_heads, block_mask)
    if user is not None and q.numel() != 0 and k.numel() != 0:
        deterministic = _deterministic(deterministic)
        out, lse = _user_variant_call(
            lambda q, k, v, sinks: _forward(q, k, v, scale, mask, layout, checked=True, softcap=softcap,
                                            window=window, alibi_slopes=alibi_slopes, sinks=sinks,
                                            attention_chunk=chunk, user=user),
            lambda dout, q, k, v, out, lse, sinks: _backward_kernels(
                dout, q, k, v, out, lse, scale, mask, layout, deterministic, softcap, window, alibi_slopes, sinks,
                chunk, user=user),
            q, k, v, sinks)
        return (out, lse) if return_lse else out
    if q.numel() == 0 or k.numel() == 0:
        out, lse = _Empty.apply(q, k, v, _lse_shape(q, layout), sinks)
    else:
        args = (q, k, v, scale, mask, layout, _deterministic(deterministic), softcap, *window, alibi_slopes, sinks,
                chunk)
        if not _eager_call(q, k, v):
            out, lse = torch.ops.flashgen.attention_forward(*args)
        elif torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, sinks)):
            out, lse = _EagerAttention.apply(*args)
        else:  # nothing to differentiate: no autograd node at all
            out, lse = _forward(q, k, v, scale, mask, layout, checked=True, softcap=softcap, window=window,
                                alibi_slopes=alibi_slopes, sinks=sinks, attention_chunk=chunk)
    return (out, lse) if return_lse else out


def explain(q, k, v, *, causal=False, causal_align="bottom_right", scale=None, layout="bshd", deterministic=False,
            backward=True, softcap=0.0, window_size=(-1, -1), attention_chunk=0, alibi_slopes=None, sinks=None):
    """Which kernels attention(q, k, v, ...) with these arguments runs, and why, as a dict:
    {"library": path, "version": ..., "forward": {...}, "backward": {...}}. Each pass has "config" (the kernel
    config's canonical name), "source" ("tuning database", "tuned on first use", "shipped defaults" or
    "heuristic"), "reason" (the chooser's full explanation), "arch", "source_path" (the generated CUDA source,
    written into the kernel cache; compile it with nvcc as is), the launch grid, threads, shared memory and each
    kernel's registers and spills; the backward also has "workspace_bytes". Compiles or loads the kernels like a
    first call (and with tune-on-first-use on, tunes an untuned problem first) but runs nothing. Allocates what
    the call would (out, lse and, with backward, dout and the gradients) for as long as it runs. With sinks (as
    attention() takes them) the backward lists the kernel of the sinks' gradient too. With attention_chunk (as
    attention() takes it) both passes run the chunked kernels (configs named ..._chunk).
    """
    mask, window = _mask_and_window(causal, causal_align, window_size)
    chunk = _check_chunk(attention_chunk, mask)
    q, k, v = _autocast(q, k, v)
    _check_inputs(q, k, v, layout)
    scale = _check_scale(scale)
    softcap = _check_softcap(softcap)
    deterministic = _deterministic(deterministic)
    answer = {"library": _lib.library_path(), "version": _lib.version()}
    with torch.no_grad(), torch.cuda.device(q.device):
        stream = _stream(q.device)
        forward = _ForwardCall(q, k, v, scale, mask, layout, softcap, window, alibi_slopes, sinks, chunk)
        answer["forward"] = _lib.call_json("flashgen_explain_forward", *forward.arguments(), stream)
        if backward:
            call = _BackwardCall(torch.empty_like(forward.out), q, k, v, forward.out, forward.lse, scale, mask,
                                 layout, deterministic, softcap, window, alibi_slopes, forward.sinks, chunk)
            answer["backward"] = _lib.call_json("flashgen_explain_backward", *call.arguments(), stream)
    return answer


def tune(q, k, v, *, causal=False, causal_align="bottom_right", layout="bshd"):
    """Tunes the forward kernel for the size bucket of attention(q, k, v, ...) on q's GPU, now: sweeps 16 candidate
    configs (compiled in parallel, each checked against a float64 reference and timed on inputs of its own;
    seconds), stores every timing and the winner in the user's tuning database ($FLASHGEN_TUNING_DB, else
    ~/.local/share/flashgen/tuning.sqlite) and makes the winner this process's choice; later processes read it
    from the database. Only the tensors' shapes, dtype and device matter. Returns {"problem": bucket id, "config":
    winner, "reason": ..., "db": path}. The backward is tuned by set_tune_on_first_use(True) on its first call, or
    ahead of time with `flashgen tune --backward`. The problem is the plain one (no window, chunk, soft cap or
    ALiBi): a variant's problem class is tuned by `flashgen tune --window/--chunk/--softcap/--alibi` or on its first
    call.
    """
    mask = _mask(causal, causal_align)
    _check_inputs(q, k, v, layout)
    batch, seqlen_q, heads_q, head_dim = _bshd_shape(q, layout)
    _, seqlen_k, heads_kv, _ = _bshd_shape(k, layout)
    problem = _lib.ForwardProblem(_DTYPE_CODES[q.dtype], _MASK_CODES[mask], batch, seqlen_q, seqlen_k, heads_q,
                                  heads_kv, head_dim)
    with torch.cuda.device(q.device):
        return _lib.call_json("flashgen_tune_forward", ctypes.byref(problem), _stream(q.device))


# ---------------------------------------------------------------------------------------------------------
# Packed variable-length batches: FlashAttention's flash_attn_varlen_func arguments, the forward.

def _check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k,
                         block_table=None):
    """Raises FlashgenArgumentError naming the argument for what the library cannot see (types, devices, ranks,
    dtypes, the offsets' length); sizes, strides and the packing's ranges are the library's to check."""
    if block_table is None:
        _check_qkv(q, k, v, 3, "3-d packed tensor [total, heads, head_dim]")
    else:
        _check_qkv(q, k, v, 3, "3-d packed tensor [total, heads, head_dim]", 4,
                   "4-d paged cache [num_pages, page_size, heads_kv, head_dim] (with a block_table)")
        if (not isinstance(block_table, torch.Tensor) or block_table.dtype != torch.int32 or block_table.dim() != 2
                or block_table.device != q.device):
            _bad(f"block_table: expected a 2-d torch.int32 tensor [batch, max_pages] on {q.device}")
        if block_table.shape[0] != cu_seqlens_q.shape[0] - 1:
            _bad(f"block_table.shape[0] is {block_table.shape[0]} but there are {cu_seqlens_q.shape[0] - 1} sequences")
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k), ("seqused_k", seqused_k)):
        if t is None and name == "seqused_k":
            continue
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != 1 or t.device != q.device:
            _bad(f"{name}: expected a 1-d torch.int32 tensor on {q.device}, got "
                f"{t.dtype if isinstance(t, torch.Tensor) else type(t).__name__}"
                f"{' ' + str(list(t.shape)) + ' on ' + str(t.device) if isinstance(t, torch.Tensor) else ''}")
    if cu_seqlens_q.shape[0] < 2 or cu_seqlens_k.shape[0] != cu_seqlens_q.shape[0]:
        _bad(f"cu_seqlens_q and cu_seqlens_k must both hold batch + 1 >= 2 offsets, got {cu_seqlens_q.shape[0]} and "
            f"{cu_seqlens_k.shape[0]}")
    if seqused_k is not None and seqused_k.shape[0] != cu_seqlens_q.shape[0] - 1:
        _bad(f"seqused_k must hold batch = {cu_seqlens_q.shape[0] - 1} lengths, got {seqused_k.shape[0]}")
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if not isinstance(value, int) or isinstance(value, bool):
            _bad(f"{name}: expected an int, got {type(value).__name__}")






@torch.library.custom_op("flashgen::varlen_attention_forward", mutates_args=())
def _varlen_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                              cu_seqlens_k: torch.Tensor, seqused_k: Optional[torch.Tensor], max_seqlen_q: int,
                              max_seqlen_k: int, scale: float, mask: str, deterministic: bool,
                              block_table: Optional[torch.Tensor] = None, softcap: float = 0.0,
                              window_left: int = -1, window_right: int = -1,
                              alibi_slopes: Optional[torch.Tensor] = None,
                              sinks: Optional[torch.Tensor] = None,
                              attention_chunk: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of a packed batch; lse is fp32 [heads_q, total_q]. deterministic is the backward's (autograd hands
    it on). With block_table, k and v are paged caches."""
    return _varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, scale, mask,
                           block_table, softcap, (window_left, window_right), alibi_slopes, sinks, attention_chunk)


@_varlen_attention_forward.register_fake
def _varlen_attention_forward_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, scale,
                                   mask, deterministic, block_table=None, softcap=0.0, window_left=-1,
                                   window_right=-1, alibi_slopes=None, sinks=None, attention_chunk=0):
    return q.new_empty(q.shape), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)




@torch.library.custom_op("flashgen::varlen_attention_backward", mutates_args=())
def _varlen_attention_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               out: torch.Tensor, lse: torch.Tensor, cu_seqlens_q: torch.Tensor,
                               cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, scale: float,
                               mask: str, deterministic: bool, softcap: float = 0.0, window_left: int = -1,
                               window_right: int = -1, alibi_slopes: Optional[torch.Tensor] = None,
                               sinks: Optional[torch.Tensor] = None, attention_chunk: int = 0
                               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dsinks) of a packed batch given dout and the forward's out and lse; dsinks is fp32 [heads_q]
    with sinks (summed over every sequence), else empty [0]. The kernels' workspace comes from flashgen's own
    memory pool (kept between calls; flashgen.release_cached_memory() returns it), outside the caching
    allocator."""
    return _varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale,
                            mask, deterministic, softcap, (window_left, window_right), alibi_slopes, sinks,
                            attention_chunk)


@_varlen_attention_backward.register_fake
def _varlen_attention_backward_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                    scale, mask, deterministic, softcap=0.0, window_left=-1, window_right=-1,
                                    alibi_slopes=None, sinks=None, attention_chunk=0):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), _dsinks(q, q.shape[1], sinks)


def _varlen_setup_context(ctx, inputs, output):
    q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, scale, mask, deterministic = inputs[:11]
    out, lse = output
    # With the ALiBi slopes and the sinks (the backward reads both).
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                          *(inputs[i] if len(inputs) > i else None for i in (15, 16)))
    ctx.sizes = (max_seqlen_q, max_seqlen_k, scale, mask)
    ctx.has_seqused_k = seqused_k is not None or (len(inputs) > 11 and inputs[11] is not None)
    ctx.deterministic = deterministic
    ctx.softcap = inputs[12] if len(inputs) > 12 else 0.0
    ctx.window = tuple(inputs[13:15]) if len(inputs) > 14 else _NO_WINDOW
    ctx.attention_chunk = inputs[17] if len(inputs) > 17 else 0
    ctx.mark_non_differentiable(lse)
    ctx.set_materialize_grads(False)


def _varlen_backward_formula(ctx, dout, dlse):
    if dout is None:
        return (None,) * 18
    if ctx.has_seqused_k:
        raise NotImplementedError("flashgen.torch.varlen_attention: no backward with seqused_k or a block_table")
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes, sinks = ctx.saved_tensors
    max_seqlen_q, max_seqlen_k, scale, mask = ctx.sizes
    dq, dk, dv, dsinks = torch.ops.flashgen.varlen_attention_backward(
        dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, mask,
        ctx.deterministic, ctx.softcap, *ctx.window, alibi_slopes, sinks, ctx.attention_chunk)
    # None for the offsets, sizes, flags and slopes; the sinks' gradient when there are sinks; None for the chunk.
    return (dq, dk, dv) + (None,) * 13 + (dsinks if sinks is not None else None, None)


_varlen_attention_forward.register_autograd(_varlen_backward_formula, setup_context=_varlen_setup_context)


def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                     softmax_scale=None, causal=False, *, causal_align="bottom_right", seqused_k=None,
                     block_table=None, deterministic=False, return_attn_probs=False, softcap=0.0, window_size=(-1, -1),
                     attention_chunk=0, alibi_slopes=None, sinks=None, mask_mod=None, score_mod=None, score_grad=None,
                     score_bias=None, variant_helpers=None, variant_args=None, mask_same_for_heads=False,
                     block_mask=None):
    """Attention over a packed batch of sequences of different lengths, with FlashAttention's
    flash_attn_varlen_func arguments: q [total_q, heads_q, head_dim], k and v [total_k, heads_kv, head_dim] (CUDA
    float16 or bfloat16); cu_seqlens_q and cu_seqlens_k int32 [batch + 1] offsets on q's device (sequence b owns
    rows cu_seqlens_q[b]:cu_seqlens_q[b + 1] of q and the output, cu_seqlens_k[b]:cu_seqlens_k[b + 1] of k and v);
    max_seqlen_q and max_seqlen_k at least every sequence's lengths (ints, as FlashAttention takes them: no
    device-to-host copy here). Each sequence is its own problem: causal masks within it, aligned
    "bottom_right" (FlashAttention's) or "top_left"; heads_q a multiple of heads_kv (GQA); a row that sees no key
    gets output 0 and lse -inf (its head's sink, with sinks); empty sequences are allowed. seqused_k: int32
    [batch], the keys each sequence uses from its offset (a KV cache's filled part), or None. dropout_p must be 0.
    block_table: int32 [batch, max_pages] for prefill against a paged KV cache: k and v are then [num_pages,
    page_size, heads_kv, head_dim] (page_size a multiple of 16), sequence b's key j lies in row j % page_size of
    page block_table[b, j // page_size], and its key count is seqused_k[b], else cu_seqlens_k[b + 1] -
    cu_seqlens_k[b] (forward only). softcap > 0: each score s = q·k · scale becomes softcap · tanh(s / softcap)
    before the softmax (FlashAttention's softcap), forward and backward; 0.0 for none. window_size=(left, right):
    FlashAttention's sliding window within each sequence, as attention() takes it (aligned bottom-right: with
    causal=True the right side is 0; (-1, -1) for none). attention_chunk=C > 0: chunked attention (Llama 4's) within
    each sequence, as attention() takes it: query i of a sequence sees only its keys j with j // C == (i + seqlen_k -
    seqlen_q) // C, its own lengths aligned bottom-right, on top of the mask or window; 0 for none. alibi_slopes:
    float32 [heads_q] or [batch, heads_q] ALiBi slopes (FlashAttention's), each sequence's bias about its own
    diagonal, as attention() takes them. sinks: attention sinks (gpt-oss), [heads_q] on q's device, as attention() takes
    them: one logit per query head that joins every row's softmax denominator with no value, out_i = Σ_j e^(s_ij) v_j /
    (e^sink + Σ_j e^(s_ij)), lse including it (a row that sees no key gets out 0 and lse = sink; -inf for a head is no
    sink there). mask_mod, score_mod, score_grad, score_bias, variant_helpers, variant_args: a user-defined variant as
    attention() takes it, batch being the sequence's index and q_idx, kv_idx positions within it (eager calls only).

    Returns out [total_q, heads_q, head_dim] (a new tensor), or (out, lse, None) with return_attn_probs, lse being
    fp32 [heads_q, total_q] (natural log) as FlashAttention returns softmax_lse. Differentiable in q, k and v (each
    sequence's gradients; keys no query of their sequence sees get zero dk and dv; not with seqused_k) and in sinks
    (summed over every sequence and row); deterministic: the backward's dQ summed in a fixed order, bitwise
    repeatable (also on under torch.use_deterministic_algorithms(True)). Runs on the current CUDA stream of q's
    device; the custom ops flashgen::varlen_attention_forward and flashgen::varlen_attention_backward serve
    torch.compile and CUDA graphs (the backward's workspace comes from flashgen's memory pool, a graph's own while
    captured).
    Offsets are read on the device only and clamped into the tensors: wrong offsets give wrong rows, never an
    access outside the tensors.
    """
    if dropout_p != 0.0:
        raise FlashgenArgumentError(f"dropout_p must be 0.0 (flashgen has no dropout), got {dropout_p}",
                                    _lib.ERROR_INVALID_ARGUMENT)
    mask, window = _mask_and_window(causal, causal_align, window_size)
    chunk = _check_chunk(attention_chunk, mask)
    scale = _check_scale(softmax_scale)
    softcap = _check_softcap(softcap)
    _check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k, block_table)
    alibi_slopes = _check_alibi(alibi_slopes, q.device, cu_seqlens_q.shape[0] - 1, q.shape[1])
    sinks = _check_sinks(sinks, q.device, q.shape[1])
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, sinks))
    if needs_grad and (seqused_k is not None or block_table is not None):
        raise NotImplementedError("flashgen.torch.varlen_attention: no backward with seqused_k or a block_table; "
                                  "call it under torch.no_grad() or on inputs without gradients")
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, scale, mask)
    user = user_variant(q.device, mask_mod, score_mod, score_grad, score_bias, variant_helpers, variant_args,
                        mask_same_for_heads, block_mask)
    if user is not None:
        deterministic = _deterministic(deterministic)
        out, lse = _user_variant_call(
            lambda q, k, v, sinks: _varlen_forward(q, k, v, *args[3:], block_table, softcap, window, alibi_slopes,
                                                   sinks, chunk, user=user),
            lambda dout, q, k, v, out, lse, sinks: _varlen_backward(
                dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, mask,
                deterministic, softcap, window, alibi_slopes, sinks, chunk, user=user),
            q, k, v, sinks)
        return (out, lse, None) if return_attn_probs else out
    if _eager_call(q, k, v) and not needs_grad:
        out, lse = _varlen_forward(*args, block_table, softcap, window, alibi_slopes, sinks, chunk)
    else:
        out, lse = torch.ops.flashgen.varlen_attention_forward(*args, _deterministic(deterministic), block_table,
                                                               softcap, *window, alibi_slopes, sinks, chunk)
    return (out, lse, None) if return_attn_probs else out


# ---------------------------------------------------------------------------------------------------------
# Decoding against a KV cache: FlashAttention's flash_attn_with_kvcache arguments.

def _check_kvcache_inputs(q, k_cache, v_cache, k, v, cache_seqlens, block_table):
    """Raises FlashgenArgumentError naming the argument for what the library cannot see (types, devices, ranks,
    dtypes of the int32 tensors); sizes, strides and the cache's shape are the library's to check."""
    _check_qkv(q, k_cache, v_cache, 4, "4-d tensor (q: [batch, seqlen_q, heads_q, head_dim]; k_cache, v_cache: "
               "[batch, capacity, heads_kv, head_dim] or [num_pages, page_size, heads_kv, head_dim])")
    if (k is None) != (v is None):
        _bad("k and v: give both (the new tokens to append) or neither")
    if k is not None:
        _check_qkv(q, k, v, 4, "4-d tensor [batch, seqlen_new, heads_kv, head_dim]")
    for name, t, rank in (("cache_seqlens", cache_seqlens, 1), ("block_table", block_table, 2)):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != rank or t.device != q.device:
            _bad(f"{name}: expected a {rank}-d torch.int32 tensor on {q.device}, got "
                f"{t.dtype if isinstance(t, torch.Tensor) else type(t).__name__}"
                f"{' ' + str(list(t.shape)) + ' on ' + str(t.device) if isinstance(t, torch.Tensor) else ''}")
        if t.shape[0] != q.shape[0]:
            _bad(f"{name}.shape[0] is {t.shape[0]} but q.shape[0] (batch) is {q.shape[0]}")


def _kvcache_args(q, k_cache, v_cache, k, v, cache_seqlens, block_table, out, lse, scale, mask, num_splits, window,
                  sinks, attention_chunk=0, softcap=0.0, alibi_slopes=None, user=None):
    """flashgen_kvcache_args over the tensors (each readable in place: the caches are written in place when k and
    v are given, so they are never copied); sinks and alibi_slopes checked; user: a _variants.UserVariant or None."""
    args = _lib.KvCacheArgs()
    args.size = ctypes.sizeof(args)
    args.q, args.k_cache, args.v_cache, args.out = (_view(t, "bshd") for t in (q, k_cache, v_cache, out))
    if k is not None:
        args.k_new, args.v_new = _view(k, "bshd"), _view(v, "bshd")
    args.lse = lse.data_ptr()
    args.cache_seqlens = cache_seqlens.data_ptr() if cache_seqlens is not None else None
    if block_table is not None:
        args.block_table, args.max_pages = block_table.data_ptr(), block_table.shape[1]
    args.num_splits = num_splits
    args.options = _options(scale, mask, False, softcap, window, alibi_slopes, sinks,
                            attention_chunk=attention_chunk, user=user)
    return args


# Split workspace bytes the library asked for, per problem class (everything of a call but its data): a warm call
# asks the library once, not twice. Cleared when it grows past 4096 classes.
_KVCACHE_WORKSPACE = {}


def _kvcache_class(q, k_cache, v_cache, k, cache_seqlens, block_table, scale, mask, num_splits, window, sinks,
                   attention_chunk=0, softcap=0.0, alibi_slopes=None, user=None):
    return (q.device, q.dtype, tuple(q.shape), q.stride(), tuple(k_cache.shape), k_cache.stride(), v_cache.stride(),
            None if k is None else (tuple(k.shape), k.stride()),
            None if block_table is None else tuple(block_table.shape), cache_seqlens is None, scale, mask, num_splits,
            window, sinks is None, attention_chunk, softcap, alibi_slopes is None, None if user is None else user.handle)


class _KvCachePlan:
    """The KvCacheArgs of one KV-cache call signature without a user variant, built once and re-pointed at each
    call's tensors (as _ForwardPlan): q, out, lse, the caches, and where the call has them the appended tokens, the
    block table, the sinks and the ALiBi slopes. The caches' capacity and strides are not part of the signature:
    transformers' cache grows by a token per generated token, so they change at every step; the plan rewrites them,
    and asks the library for the split workspace again when they change."""

    __slots__ = ("args", "args_ref", "lse_shape", "workspace_for", "workspace_bytes")

    def __init__(self, q, k_cache, v_cache, k, v, out, lse, cache_seqlens, block_table, scale, mask, num_splits,
                 window, sinks, attention_chunk, softcap, alibi_slopes):
        self.args = _kvcache_args(q, k_cache, v_cache, k, v, cache_seqlens, block_table, out, lse, scale, mask,
                                  num_splits, window, sinks, attention_chunk, softcap, alibi_slopes)
        self.args_ref = ctypes.byref(self.args)
        self.lse_shape = tuple(lse.shape)
        self.workspace_for = None  # the (capacity, strides) workspace_bytes was asked for
        self.workspace_bytes = 0


def _kvcache_plan_key(q, k_cache, v_cache, k, v, cache_seqlens, block_table, scale, mask, num_splits, window, sinks,
                      attention_chunk, softcap, alibi_slopes):
    return (q.shape, q.stride(), q.dtype, q.device, k_cache.shape[0], k_cache.shape[2:], k_cache.dtype,
            k_cache.device, v_cache.shape[0], v_cache.shape[2:], v_cache.dtype, v_cache.device,
            None if cache_seqlens is None else (cache_seqlens.shape, cache_seqlens.dtype, cache_seqlens.device), scale,
            mask, num_splits, window, attention_chunk, softcap, _layout_key(k), _layout_key(v),
            _layout_key(block_table), _layout_key(sinks), _layout_key(alibi_slopes))


def _planned_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, block_table, scale, mask, num_splits, window, sinks,
                     attention_chunk, softcap, alibi_slopes, create):
    """(out, lse) of a KV-cache call through its signature's _KvCachePlan (see there for which calls), or None where
    the call takes the full path: q, k or v not readable in place, a block table that is not contiguous, sinks that
    are not float32, a legacy default stream on another device, or (create=False) no plan yet. A plan exists only
    for a signature whose arguments passed the checks; the optional tensors must be tensors (or None)."""
    key = _kvcache_plan_key(q, k_cache, v_cache, k, v, cache_seqlens, block_table, scale, mask, num_splits, window,
                            sinks, attention_chunk, softcap, alibi_slopes)
    plans = _plans.kvcache
    plan = plans.get(key)
    if plan is None and not create:
        return None
    device = q.device
    stream = _stream_handle(device)
    aligned = q.data_ptr() | (0 if k is None else k.data_ptr() | v.data_ptr())
    if (aligned & 15) or (stream == 0 and device.index != _current_device()):
        return None
    out = torch.empty(q.shape, dtype=q.dtype, device=device)
    if plan is None:
        if not all(_strides_readable(t) for t in (q, k, v) if t is not None):
            return None
        if block_table is not None and not block_table.is_contiguous():
            return None
        if not _plannable_extras(alibi_slopes, sinks, device, q.shape[0], q.shape[2]):
            return None
        lse = torch.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32, device=device)
        if len(plans) >= _Plans.limit:
            plans.clear()
        plan = plans[key] = _KvCachePlan(q, k_cache, v_cache, k, v, out, lse, cache_seqlens, block_table, scale, mask,
                                         num_splits, window, sinks, attention_chunk, softcap, alibi_slopes)
    else:
        lse = torch.empty(plan.lse_shape, dtype=torch.float32, device=device)
    args = plan.args
    args.q.data, args.out.data, args.lse = q.data_ptr(), out.data_ptr(), lse.data_ptr()
    for view, cache in ((args.k_cache, k_cache), (args.v_cache, v_cache)):
        view.data = cache.data_ptr()
        view.shape[1] = cache.shape[1]
        view.stride[0], view.stride[1], view.stride[2] = cache.stride()[:3]
    if cache_seqlens is not None:
        args.cache_seqlens = cache_seqlens.data_ptr()
    if k is not None:
        args.k_new.data, args.v_new.data = k.data_ptr(), v.data_ptr()
    if block_table is not None:
        args.block_table = block_table.data_ptr()
    if sinks is not None:
        args.options.sinks = sinks.data_ptr()
    if alibi_slopes is not None:
        args.options.alibi_slopes = alibi_slopes.data_ptr()
    layout = (k_cache.shape[1], k_cache.stride(), v_cache.stride())
    if plan.workspace_for != layout:
        size = ctypes.c_size_t(0)
        args.workspace, args.workspace_bytes = None, 0
        _lib.check(_lib.function("flashgen_attention_kvcache_workspace_size")(plan.args_ref, stream, ctypes.byref(size)),
                   "flashgen_attention_kvcache_workspace_size")
        plan.workspace_for, plan.workspace_bytes = layout, size.value
    workspace = None
    if plan.workspace_bytes > 0:  # from torch's allocator: captured with the call into a CUDA graph's pool
        workspace = torch.empty(plan.workspace_bytes, dtype=torch.uint8, device=device)
        args.workspace, args.workspace_bytes = workspace.data_ptr(), plan.workspace_bytes
    status = _lib.function("flashgen_attention_kvcache")(plan.args_ref, stream)
    if status != _lib.SUCCESS:
        plan.workspace_for = None  # a choice made since may want another workspace: ask again next time
        _lib.check(status, "flashgen_attention_kvcache")
    return out, lse


def _kvcache(q, k_cache, v_cache, k, v, cache_seqlens, block_table, scale, mask, num_splits, window=_NO_WINDOW,
             sinks=None, attention_chunk=0, softcap=0.0, alibi_slopes=None, user=None):
    if user is None:
        planned = _planned_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, block_table, scale, mask, num_splits,
                                   window, sinks, attention_chunk, softcap, alibi_slopes, create=True)
        if planned is not None:
            return planned
    with torch.cuda.device(q.device):
        sinks = _check_sinks(sinks, q.device, q.shape[2])
        alibi_slopes = _check_alibi(alibi_slopes, q.device, q.shape[0], q.shape[2])
        q = _readable(q)
        if k is not None:
            k, v = _readable(k), _readable(v)
        block_table = block_table.contiguous() if block_table is not None else None
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        lse = torch.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32, device=q.device)
        args = _kvcache_args(q, k_cache, v_cache, k, v, cache_seqlens, block_table, out, lse, scale, mask, num_splits,
                             window, sinks, attention_chunk, softcap, alibi_slopes, user)
        stream = _stream(q.device)
        key = _kvcache_class(q, k_cache, v_cache, k, cache_seqlens, block_table, scale, mask, num_splits, window,
                             sinks, attention_chunk, softcap, alibi_slopes, user)
        needed = _KVCACHE_WORKSPACE.get(key)
        if needed is None:
            size = ctypes.c_size_t(0)
            _lib.check(_lib.function("flashgen_attention_kvcache_workspace_size")(ctypes.byref(args), stream,
                                                                                ctypes.byref(size)),
                       "flashgen_attention_kvcache_workspace_size")
            if len(_KVCACHE_WORKSPACE) >= 4096:
                _KVCACHE_WORKSPACE.clear()
            needed = _KVCACHE_WORKSPACE[key] = size.value
        # The split workspace from torch's allocator: captured with the call into a CUDA graph's pool.
        workspace = None
        if needed > 0:
            workspace = torch.empty(needed, dtype=torch.uint8, device=q.device)
            args.workspace, args.workspace_bytes = workspace.data_ptr(), needed
        status = _lib.function("flashgen_attention_kvcache")(ctypes.byref(args), stream)
        if status != _lib.SUCCESS:
            _KVCACHE_WORKSPACE.pop(key, None)  # a choice made since may want another workspace: ask again next time
        _lib.check(status, "flashgen_attention_kvcache")
    return out, lse


@torch.compiler.disable
def _kvcache_with_user(*args, user):
    """_kvcache of a call with a user variant, run eagerly (its functions and tensors are no op's arguments)."""
    return _kvcache(*args, user=user)


@torch.library.custom_op("flashgen::attention_kvcache", mutates_args=("k_cache", "v_cache"))
def _attention_kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k: Optional[torch.Tensor],
                       v: Optional[torch.Tensor], cache_seqlens: Optional[torch.Tensor],
                       block_table: Optional[torch.Tensor], scale: float, mask: str, num_splits: int,
                       window_left: int = -1, window_right: int = -1, sinks: Optional[torch.Tensor] = None,
                       attention_chunk: int = 0, softcap: float = 0.0,
                       alibi_slopes: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of new queries against a KV cache; lse is fp32 [batch, heads_q, seqlen_q]. With k and v, their rows
    are first written into k_cache and v_cache. sinks: None or fp32 [heads_q] attention sinks; attention_chunk: 0 or
    the chunk's length; softcap: 0.0 or the cap; alibi_slopes: None or the ALiBi slopes."""
    return _kvcache(q, k_cache, v_cache, k, v, cache_seqlens, block_table, scale, mask, num_splits,
                    (window_left, window_right), sinks, attention_chunk, softcap, alibi_slopes)


@_attention_kvcache.register_fake
def _attention_kvcache_fake(q, k_cache, v_cache, k, v, cache_seqlens, block_table, scale, mask, num_splits,
                            window_left=-1, window_right=-1, sinks=None, attention_chunk=0, softcap=0.0,
                            alibi_slopes=None):
    return q.new_empty(q.shape), q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)


def attention_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None, cache_seqlens=None,
                           cache_batch_idx=None, cache_leftpad=None, block_table=None, softmax_scale=None,
                           causal=False, window_size=(-1, -1), softcap=0.0, rotary_interleaved=True,
                           alibi_slopes=None, num_splits=0, return_softmax_lse=False, *, causal_align="bottom_right",
                           sinks=None, attention_chunk=0, mask_mod=None, score_mod=None, score_grad=None,
                           score_bias=None, variant_helpers=None, variant_args=None, mask_same_for_heads=False):
    """Attention of a few new query tokens per sequence against its KV cache (decoding), with FlashAttention's
    flash_attn_with_kvcache arguments: q [batch, seqlen_q, heads_q, head_dim]; k_cache and v_cache [batch,
    capacity, heads_kv, head_dim], or with block_table (int32 [batch, max_pages]) paged caches [num_pages,
    page_size, heads_kv, head_dim] (page_size a multiple of 16), sequence b's key j living in row j % page_size of
    page block_table[b, j // page_size]; cache_seqlens: int32 [batch] (or an int for every sequence) keys in each
    cache, None for full caches. k and v [batch, seqlen_new, heads_kv, head_dim] (optional): the new tokens' keys and
    values, written into the caches in place at rows cache_seqlens[b]... before attending (cache_seqlens itself is
    not updated). Each sequence attends to its first cache_seqlens[b] + seqlen_new keys; causal=True aligns its
    queries with its last keys ("bottom_right", FlashAttention's) or, with causal_align="top_left", its first.
    window_size=(left, right): FlashAttention's sliding window about the same bottom-right diagonal (new query i of
    n sees keys cache_seqlens[b] + seqlen_new - n + i - left to ... + right; -1 for no bound on a side; with
    causal=True the right side is 0; (-1, -1) for none). attention_chunk=C > 0 (keyword only): chunked attention
    (Llama 4's) about the same diagonal, as attention() takes it: new query i sees only the keys j of its own chunk,
    j // C == (cache_seqlens[b] + seqlen_new - n + i) // C, on top of the mask or window (a decode step past a chunk
    boundary sees only the new chunk's keys); 0 for none. GQA/MQA as for attention(). num_splits: key ranges per
    sequence merged by LSE, 0 lets flashgen choose for the GPU and problem (a short window over a long cache gets
    few: only the blocks it visits are split), 1 gives batch-invariant results. sinks: attention sinks (gpt-oss),
    [heads_q] on q's device, as attention() takes them: one logit per query head that joins every row's softmax
    denominator with no value, out_i = Σ_j e^(s_ij) v_j / (e^sink + Σ_j e^(s_ij)), lse including it (a row that
    sees no key gets out 0 and lse = sink; -inf for a head is no sink there); with splits it joins once, where the
    ranges are merged. softcap and alibi_slopes as attention() takes them (slopes [heads_q] or [batch, heads_q], the
    bias about each sequence's last key). mask_mod, score_mod, score_bias, variant_helpers and variant_args (keyword
    only): a user-defined variant as attention() takes it, compiled into the KV-cache kernels; its functions see the
    new tokens as q_idx 0 .. seqlen_q - 1 and the keys by their position in the sequence (the new tokens' keys
    last), as a call with fewer queries than keys does: pass cache_seqlens among variant_args to find the new tokens'
    keys. Every key block is evaluated with the mask (decoding reads each key once, so there are no block classes to
    skip with; score_grad and mask_same_for_heads are accepted and unused). Such calls run eagerly (torch.compile
    leaves them out of its graphs). rotary embeddings, cache_batch_idx and cache_leftpad are not supported yet (a
    value other than the default is refused).

    Returns out [batch, seqlen_q, heads_q, head_dim] (a new tensor), or (out, lse) with return_softmax_lse, lse
    being fp32 [batch, heads_q, seqlen_q]. Not differentiable (a sinks parameter that requires grad is read
    detached). Runs on the current CUDA stream of q's device as the
    custom op flashgen::attention_kvcache (torch.compile keeps it; its split workspace comes from torch's
    allocator, so a CUDA graph captures it). cache_seqlens and block_table are read on the device only and clamped
    into the caches: wrong values give wrong rows, never an access outside them.
    """
    unsupported = {"rotary_cos": rotary_cos is not None, "rotary_sin": rotary_sin is not None,
                   "cache_batch_idx": cache_batch_idx is not None, "cache_leftpad": cache_leftpad is not None}
    for name, given in unsupported.items():
        if given:
            raise FlashgenArgumentError(f"{name}: not supported by flashgen.torch.attention_with_kvcache yet",
                                        _lib.ERROR_UNSUPPORTED)
    mask, window = _mask_and_window(causal, causal_align, window_size)
    chunk = _check_chunk(attention_chunk, mask)
    scale = _check_scale(softmax_scale)
    if isinstance(num_splits, bool) or not isinstance(num_splits, int):
        _bad(f"num_splits: expected an int, got {type(num_splits).__name__}")
    if isinstance(cache_seqlens, int) and not isinstance(cache_seqlens, bool):
        cache_seqlens = torch.full((q.shape[0],), cache_seqlens, dtype=torch.int32, device=q.device)
    softcap = _check_softcap(softcap)
    if (mask_mod is None and score_mod is None and score_bias is None and _eager_call(q, k_cache, v_cache)
            and all(t is None or isinstance(t, torch.Tensor) for t in (k, v, cache_seqlens, block_table, sinks,
                                                                        alibi_slopes))):
        # The warm call of a signature seen before: its plan's key holds all that the checks below look at.
        planned = _planned_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, block_table, scale, mask, num_splits,
                                   window, _warm_sinks(sinks), chunk, softcap, alibi_slopes, create=False)
        if planned is not None:
            return planned if return_softmax_lse else planned[0]
    _check_kvcache_inputs(q, k_cache, v_cache, k, v, cache_seqlens, block_table)
    sinks = _check_sinks(sinks, q.device, q.shape[2])
    if sinks is not None:  # no autograd node for a model's sinks parameter: the op has no backward
        sinks = sinks.detach()
    alibi_slopes = _check_alibi(alibi_slopes, q.device, q.shape[0], q.shape[2])
    user = user_variant(q.device, mask_mod, score_mod, score_grad, score_bias, variant_helpers, variant_args,
                        mask_same_for_heads)
    args = (q, k_cache, v_cache, k, v, cache_seqlens, block_table, scale, mask, num_splits)
    if user is not None:
        out, lse = _kvcache_with_user(*args, window, sinks, chunk, softcap, alibi_slopes, user=user)
    elif _eager_call(q, k_cache, v_cache):
        out, lse = _kvcache(*args, window, sinks, chunk, softcap, alibi_slopes)
    else:
        out, lse = torch.ops.flashgen.attention_kvcache(*args, *window, sinks, chunk, softcap, alibi_slopes)
    return (out, lse) if return_softmax_lse else out


# ---------------------------------------------------------------------------------------------------------
# scaled_dot_product_attention served by flashgen (flashgen/_sdpa.py), for programs that are not edited.

def enable():
    """Makes torch.nn.functional.scaled_dot_product_attention run flashgen's kernels, forward and backward, for every
    call that reaches its flash-attention backend and that flashgen can serve; the others run torch's own kernels
    (sdpa_stats() counts both, with the reasons). Works in eager mode, under torch.compile and in CUDA graphs
    (captured after a warm-up call, as any kernel that compiles on first use).

    Which calls: SDPA picks a backend per call; while flashgen is on, the flash backend comes first in SDPA's
    priority order, so every call the flash backend takes comes here: CUDA fp16/bf16 inputs without attn_mask,
    head_dim up to 256, with or without is_causal (aligned top-left, as SDPA's), grouped-query (enable_gqa) or not.
    Of these flashgen falls back for dropout_p > 0 and for errors of the library (the last message is in
    sdpa_stats()["last_error"]). Calls with an attn_mask never reach the flash backend and run as before.

    The FlashAttention-2 ops below SDPA's (aten::_flash_attention_forward/backward: torch's varlen_attn, nested
    tensors) run flashgen too, dense or packed, causal (bottom-right) or windowed; with ALiBi or seqused_k they
    fall back (their backward op takes neither).

    Through torch.nn.attention's registry under the name "flashgen" where torch has one (>= 2.10:
    torch.nn.attention.activate_flash_attention_impl("flashgen") is then the same), else by overriding the aten
    ops' CUDA kernels; needs torch >= 2.9. Returns a handle that is also a context manager:

        flashgen.torch.enable()                  # on for the rest of the process (disable() turns it off)
        with flashgen.torch.enable():            # on inside the block only
            model(batch)
    """
    from . import _sdpa
    return _sdpa.enable()


def disable():
    """Undoes enable(): scaled_dot_product_attention runs torch's kernels and SDPA's backend order is as before."""
    from . import _sdpa
    _sdpa.disable()


def sdpa_stats():
    """What scaled_dot_product_attention's flash-attention calls ran since the process started (or
    reset_sdpa_stats()): {"enabled": bool, "forward": {"flashgen": n, "fallback: <reason>": n, ...}, "backward": {...},
    "last_error": the library's message of the last call that fell back on an error, or None}. A CUDA graph's
    replays are not calls: only its capture counts."""
    from . import _sdpa
    return _sdpa.sdpa_stats()


def reset_sdpa_stats():
    """Sets sdpa_stats()'s counts to zero."""
    from . import _sdpa
    _sdpa.reset_sdpa_stats()
