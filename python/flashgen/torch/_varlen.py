"""varlen_attention(): packed batches of sequences of different lengths, with FlashAttention's flash_attn_varlen_func
arguments (and prefill against a paged KV cache)."""

import torch

from .. import _lib
from .._lib import FlashgenArgumentError
from . import _native
from ._autograd import _eager_call, _user_variant_call
from ._calls import _varlen_backward, _varlen_forward
from ._checks import (_FP8_CODES, _check_alibi, _check_chunk, _check_fp8_no_grad, _check_scale, _check_sinks,
                      _check_softcap, _check_varlen_fp8, _check_varlen_inputs, _deterministic, _mask_and_window,
                      _out_dtype_name)
from ._variants import user_variant, variant_op_arguments


def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                     softmax_scale=None, causal=False, *, causal_align="bottom_right", seqused_k=None,
                     block_table=None, deterministic=False, return_attn_probs=False, softcap=0.0, window_size=(-1, -1),
                     attention_chunk=0, alibi_slopes=None, sinks=None, mask_mod=None, score_mod=None, score_grad=None,
                     score_bias=None, variant_helpers=None, variant_args=None, mask_same_for_heads=False,
                     block_mask=None, q_descale=None, k_descale=None, v_descale=None, out_dtype=None):
    """Attention over a packed batch of sequences of different lengths, with FlashAttention's
    flash_attn_varlen_func arguments: q [total_q, heads_q, head_dim], k and v [total_k, heads_kv, head_dim] (CUDA
    float16 or bfloat16; v, and the output, may have a head_dim of their own, MLA's 128 beside 192); cu_seqlens_q and cu_seqlens_k int32 [batch + 1] offsets on q's device (sequence b owns
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

    FP8 (sm_90): q, k and v all torch.float8_e4m3fn or all torch.float8_e5m2, forward only, as attention() takes them:
    q_descale, k_descale, v_descale (keyword only, FlashAttention-3's names) float32 tensors on q's device of shape
    [batch, heads_kv] (batch: the sequences) or one that broadcasts to it, sequence b's kv head h standing for its
    codes times descale[b, h]; None for 1. out_dtype torch.bfloat16 (the default) or torch.float16. Over a paged
    cache too (block_table); not with a user variant, or inputs that require grad.
    """
    if dropout_p != 0.0:
        raise FlashgenArgumentError(f"dropout_p must be 0.0 (flashgen has no dropout), got {dropout_p}",
                                    _lib.ERROR_INVALID_ARGUMENT)
    mask, window = _mask_and_window(causal, causal_align, window_size)
    chunk = _check_chunk(attention_chunk, mask)
    scale = _check_scale(softmax_scale)
    softcap = _check_softcap(softcap)
    descales = (q_descale, k_descale, v_descale)
    if (isinstance(q, torch.Tensor) and q.dtype in _FP8_CODES) or any(d is not None for d in descales):
        # FP8 q, k and v take a forward-only path of their own; so do descales, which 16-bit ones refuse by name.
        user = (mask_mod, score_mod, score_grad, score_bias, variant_args, block_mask)
        out, lse = _fp8_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
                                       scale, mask, block_table, softcap, window, chunk, alibi_slopes, sinks,
                                       descales, out_dtype, all(x is None for x in user))
        return (out, lse, None) if return_attn_probs else out
    _check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k, block_table)
    alibi_slopes = _check_alibi(alibi_slopes, q.device, cu_seqlens_q.shape[0] - 1, q.shape[1])
    sinks = _check_sinks(sinks, q.device, q.shape[1])
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, sinks))
    if needs_grad and (seqused_k is not None or block_table is not None):
        raise NotImplementedError("flashgen.torch.varlen_attention: no backward with seqused_k or a block_table; "
                                  "call it under torch.no_grad() or on inputs without gradients")
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, scale, mask)
    if not _eager_call(q, k, v):
        # Traced (torch.compile, torch.export, a dispatch mode): a user variant goes into the graph as the variant op.
        variant = variant_op_arguments(q.device, mask_mod, score_mod, score_grad, score_bias, variant_helpers,
                                       variant_args, mask_same_for_heads, block_mask)
        if variant is not None:
            out, lse = torch.ops.flashgen.variant_varlen_attention_forward(
                *args, _deterministic(deterministic), block_table, softcap, *window, alibi_slopes, sinks, chunk,
                *variant)
            return (out, lse, None) if return_attn_probs else out
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
        if _native.loaded():
            out, lse = _native.call(torch.ops.flashgen.varlen_attention_forward.default, *args, False, block_table,
                                    softcap, *window, alibi_slopes, sinks, chunk)
        else:
            out, lse = _varlen_forward(*args, block_table, softcap, window, alibi_slopes, sinks, chunk)
    elif _eager_call(q, k, v) and _native.release_loaded():  # the C++ autograd: neither pass enters Python
        out, lse = _native.call_with_autograd(torch.ops.flashgen.varlen_attention_forward.default, *args,
                                              _deterministic(deterministic), block_table, softcap, *window,
                                              alibi_slopes, sinks, chunk)
    else:
        out, lse = torch.ops.flashgen.varlen_attention_forward(*args, _deterministic(deterministic), block_table,
                                                               softcap, *window, alibi_slopes, sinks, chunk)
    return (out, lse, None) if return_attn_probs else out


def _fp8_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, scale, mask,
                        block_table, softcap, window, chunk, alibi_slopes, sinks, descales, out_dtype, named_none):
    """(out, lse) of varlen_attention() over FP8 q, k and v (or given descales, which 16-bit ones refuse): forward
    only, no autograd node."""
    _check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k, block_table,
                         fp8=True)
    descales, out_dtype = _check_varlen_fp8(q, k, cu_seqlens_q, descales, out_dtype)
    _check_fp8_no_grad(q, k, v, sinks, "flashgen.torch.varlen_attention")
    if not named_none:
        raise FlashgenArgumentError("flashgen.torch.varlen_attention: FP8 q, k and v do not take a user variant "
                                    "(mask_mod, score_mod, score_bias, variant_args, block_mask) here",
                                    _lib.ERROR_UNSUPPORTED)
    alibi_slopes = _check_alibi(alibi_slopes, q.device, cu_seqlens_q.shape[0] - 1, q.shape[1])
    sinks = _check_sinks(sinks, q.device, q.shape[1])
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, scale, mask, False,
            block_table, softcap, *window, alibi_slopes, sinks, chunk, *descales, _out_dtype_name(out_dtype))
    if not _eager_call(q, k, v):  # traced: the op, with its fake kernel's output dtype
        return torch.ops.flashgen.varlen_attention_forward(*args)
    if _native.loaded():
        return _native.call(torch.ops.flashgen.varlen_attention_forward.default, *args)
    return _varlen_forward(*args[:10], block_table, softcap, window, alibi_slopes, sinks, chunk, descales=descales,
                           out_dtype=out_dtype)
