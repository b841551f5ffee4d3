"""flashgen.torch's autograd: the custom ops' setup_context and backward formulas (the variant ops' too), the same
work for eager calls without the dispatcher (_EagerAttention), empty inputs (_Empty), and eager calls with a user
variant (_UserVariantAttention; traced ones take the variant ops).
"""

import functools

import torch

from . import _native
from ._calls import _backward_kernels, _forward
from ._checks import _FP8_CODES, _FP8_NO_BACKWARD, _NO_WINDOW, _out_shape

try:  # read once here, not at every call
    from torch.utils._python_dispatch import _get_current_dispatch_mode
except ImportError:
    _get_current_dispatch_mode = None


def _outside_graphs(fn):
    """fn run eagerly, never traced into a torch.compile graph. torch.compiler.disable imports torch._dynamo (seconds)
    when applied, so it is applied by torch._disable_dynamo at the first call made while compiling; eager calls run fn
    directly."""
    disabled = torch._disable_dynamo(fn) if hasattr(torch, "_disable_dynamo") else None

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if torch.compiler.is_compiling():
            return (disabled or torch.compiler.disable(fn))(*args, **kwargs)
        return fn(*args, **kwargs)

    return call


def _setup_context(ctx, inputs, output, kept=()):
    """kept: more tensors the backward reads (a user variant's), saved after the others. Run only for a call that
    records autograd: one over FP8 q, k and v is refused, its forward having no backward."""
    q, k, v, scale, mask, layout, deterministic = inputs[:7]
    if q.dtype in _FP8_CODES or k.dtype in _FP8_CODES or v.dtype in _FP8_CODES:
        raise RuntimeError(f"flashgen::attention_forward: {_FP8_NO_BACKWARD}")
    out, lse = output
    # With the ALiBi slopes and the sinks (the backward reads both).
    ctx.save_for_backward(q, k, v, out, lse, *(inputs[i] if len(inputs) > i else None for i in (10, 11)), *kept)
    ctx.scale, ctx.mask, ctx.layout, ctx.deterministic = scale, mask, layout, deterministic
    ctx.softcap = inputs[7] if len(inputs) > 7 else 0.0
    ctx.window = tuple(inputs[8:10]) if len(inputs) > 9 else _NO_WINDOW
    ctx.attention_chunk = inputs[12] if len(inputs) > 12 else 0
    # The kernels compute no gradient through lse: it is returned for inspection and combining partial results.
    ctx.mark_non_differentiable(lse)
    ctx.set_materialize_grads(False)


def _backward(ctx, dout, dlse):
    """flashgen::attention_forward's backward formula: a gradient for each of its 17 arguments."""
    if dout is None:  # out took no part in the loss
        return (None,) * 17
    q, k, v, out, lse, alibi_slopes, sinks = ctx.saved_tensors
    dq, dk, dv, dsinks = torch.ops.flashgen.attention_backward(dout, q, k, v, out, lse, ctx.scale, ctx.mask,
                                                               ctx.layout, ctx.deterministic, ctx.softcap,
                                                               *ctx.window, alibi_slopes, sinks, ctx.attention_chunk)
    # None for the slopes (a fixed bias); the sinks' gradient when there are sinks; None for the chunk, the FP8
    # forward's descales and out_dtype (that forward records no autograd: _setup_context).
    return (dq, dk, dv) + (None,) * 8 + (dsinks if sinks is not None else None,) + (None,) * 5


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
        output = forward_kernels(q, k, v, scale, mask, layout, softcap, window_left, window_right, alibi_slopes, sinks,
                                 attention_chunk)
        _setup_context(ctx, (q, k, v, scale, mask, layout, deterministic, softcap, window_left, window_right,
                             alibi_slopes, sinks, attention_chunk), output)
        return output

    @staticmethod
    def backward(ctx, dout, dlse):
        if dout is None:  # out took no part in the loss
            return (None,) * 13
        q, k, v, out, lse, alibi_slopes, sinks = ctx.saved_tensors
        if _native.loaded():
            dq, dk, dv, dsinks = _native.call(torch.ops.flashgen.attention_backward.default, dout, q, k, v, out, lse,
                                              ctx.scale, ctx.mask, ctx.layout, ctx.deterministic, ctx.softcap,
                                              *ctx.window, alibi_slopes, sinks, ctx.attention_chunk)
        else:
            dq, dk, dv, dsinks = _backward_kernels(dout, q, k, v, out, lse, ctx.scale, ctx.mask, ctx.layout,
                                                   ctx.deterministic, ctx.softcap, ctx.window, alibi_slopes, sinks,
                                                   ctx.attention_chunk)
        return (dq, dk, dv) + (None,) * 8 + (dsinks if sinks is not None else None, None)


def differentiable_forward(*args):
    """(out, lse) of an eager dense call that records autograd, args as attention_forward takes them: through the op
    and its C++ autograd where the release library is loaded (neither pass enters Python), else _EagerAttention."""
    if _native.release_loaded():
        return _native.call_with_autograd(torch.ops.flashgen.attention_forward.default, *args)
    return _EagerAttention.apply(*args)


def forward_kernels(q, k, v, scale, mask, layout, softcap, window_left, window_right, alibi_slopes, sinks,
                    attention_chunk):
    """(out, lse) of an eager forward whose arguments attention() checked: the op library's kernel where it is
    loaded, else the C call through ctypes."""
    if _native.loaded():
        return _native.call(torch.ops.flashgen.attention_forward.default, q, k, v, scale, mask, layout, False,
                            softcap, window_left, window_right, alibi_slopes, sinks, attention_chunk)
    return _forward(q, k, v, scale, mask, layout, checked=True, softcap=softcap, window=(window_left, window_right),
                    alibi_slopes=alibi_slopes, sinks=sinks, attention_chunk=attention_chunk)


def _eager_call(*tensors):
    """Whether a call may skip the dispatcher (_EagerAttention): plain CUDA tensors, outside torch.compile's
    tracing and any dispatch mode."""
    if torch.compiler.is_compiling() or _current_dispatch_mode() is not None:
        return False
    for t in tensors:
        if type(t) is not torch.Tensor or not t.is_cuda:
            return False
    return True


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
        return torch.zeros(_out_shape(q, v), dtype=q.dtype, device=q.device), lse

    @staticmethod
    def backward(ctx, dout, dlse):
        dq, dk, dv, *dsinks = (torch.zeros(shape, dtype=dtype, device=device) for shape, dtype, device in ctx.like)
        return dq, dk, dv, None, dsinks[0] if dsinks else None


class _UserVariantAttention(torch.autograd.Function):
    """A call with a user variant (_variants.py): run_forward(q, k, v, sinks) gives (out, lse), run_backward(dout, q, k,
    v, out, lse, sinks) the gradients (dq, dk, dv, dsinks), each a closure over the call's other arguments and its
    variant (whose buffers it keeps alive). Eager calls only: traced ones take the variant ops."""

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


def _user_variant_call(run_forward, run_backward, q, k, v, sinks):
    """(out, lse) of an eager call with a user variant, through autograd when a gradient is wanted."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, sinks)):
        return _UserVariantAttention.apply(run_forward, run_backward, q, k, v, sinks)
    return run_forward(q, k, v, sinks)


def _variant_setup_context(ctx, inputs, output):
    """flashgen::variant_attention_forward's: attention_forward's context, and the variant's arguments (its tensors
    saved with the others)."""
    _setup_context(ctx, inputs[:13], output, kept=inputs[14])
    ctx.variant, ctx.variant_numbers = inputs[13], inputs[15]


def _no_grads(values):
    """The gradient of a list argument as torch.library's autograd expects it: one None per tensor of a list of
    tensors (the empty list included), a single None for a list of numbers."""
    return [None] * len(values) if all(isinstance(t, torch.Tensor) for t in values) else None


def _variant_backward(ctx, dout, dlse):
    q, k, v, out, lse, alibi_slopes, sinks, *variant_tensors = ctx.saved_tensors
    variant = (None, None, _no_grads(variant_tensors), _no_grads(ctx.variant_numbers))  # chunk, description, args
    if dout is None:
        return (None,) * 12 + variant
    dq, dk, dv, dsinks = torch.ops.flashgen.variant_attention_backward(
        dout, q, k, v, out, lse, ctx.scale, ctx.mask, ctx.layout, ctx.deterministic, ctx.softcap, *ctx.window,
        alibi_slopes, sinks, ctx.attention_chunk, ctx.variant, variant_tensors, ctx.variant_numbers)
    return (dq, dk, dv) + (None,) * 8 + (dsinks if sinks is not None else None,) + variant


def _variant_varlen_setup_context(ctx, inputs, output):
    """flashgen::variant_varlen_attention_forward's: varlen_attention_forward's context, and the variant's
    arguments."""
    _varlen_setup_context(ctx, inputs[:18], output, kept=inputs[19])
    ctx.variant, ctx.variant_numbers = inputs[18], inputs[20]


def _variant_varlen_backward(ctx, dout, dlse):
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes, sinks, *variant_tensors = ctx.saved_tensors
    variant = (None, None, _no_grads(variant_tensors), _no_grads(ctx.variant_numbers))  # chunk, description, args
    if dout is None:
        return (None,) * 17 + variant
    if ctx.has_seqused_k:
        raise NotImplementedError("flashgen.torch.varlen_attention: no backward with seqused_k or a block_table")
    max_seqlen_q, max_seqlen_k, scale, mask = ctx.sizes
    dq, dk, dv, dsinks = torch.ops.flashgen.variant_varlen_attention_backward(
        dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, mask,
        ctx.deterministic, ctx.softcap, *ctx.window, alibi_slopes, sinks, ctx.attention_chunk, ctx.variant,
        variant_tensors, ctx.variant_numbers)
    return (dq, dk, dv) + (None,) * 13 + (dsinks if sinks is not None else None,) + variant


def _varlen_setup_context(ctx, inputs, output, kept=()):
    """As _setup_context, for a packed call (FP8 q, k and v refused alike)."""
    q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, scale, mask, deterministic = inputs[:11]
    if q.dtype in _FP8_CODES or k.dtype in _FP8_CODES or v.dtype in _FP8_CODES:
        raise RuntimeError(f"flashgen::varlen_attention_forward: {_FP8_NO_BACKWARD}")
    out, lse = output
    # With the ALiBi slopes and the sinks (the backward reads both), and kept: a user variant's tensors.
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                          *(inputs[i] if len(inputs) > i else None for i in (15, 16)), *kept)
    ctx.sizes = (max_seqlen_q, max_seqlen_k, scale, mask)
    ctx.has_seqused_k = seqused_k is not None or (len(inputs) > 11 and inputs[11] is not None)
    ctx.deterministic = deterministic
    ctx.softcap = inputs[12] if len(inputs) > 12 else 0.0
    ctx.window = tuple(inputs[13:15]) if len(inputs) > 14 else _NO_WINDOW
    ctx.attention_chunk = inputs[17] if len(inputs) > 17 else 0
    ctx.mark_non_differentiable(lse)
    ctx.set_materialize_grads(False)


def _varlen_backward_formula(ctx, dout, dlse):
    """flashgen::varlen_attention_forward's backward formula: a gradient for each of its 22 arguments."""
    if dout is None:
        return (None,) * 22
    if ctx.has_seqused_k:
        raise NotImplementedError("flashgen.torch.varlen_attention: no backward with seqused_k or a block_table")
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes, sinks = ctx.saved_tensors
    max_seqlen_q, max_seqlen_k, scale, mask = ctx.sizes
    dq, dk, dv, dsinks = torch.ops.flashgen.varlen_attention_backward(
        dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, mask,
        ctx.deterministic, ctx.softcap, *ctx.window, alibi_slopes, sinks, ctx.attention_chunk)
    # None for the offsets, sizes, flags and slopes; the sinks' gradient when there are sinks; None for the chunk, the
    # FP8 forward's descales and out_dtype (that forward records no autograd: _varlen_setup_context).
    return (dq, dk, dv) + (None,) * 13 + (dsinks if sinks is not None else None,) + (None,) * 5
