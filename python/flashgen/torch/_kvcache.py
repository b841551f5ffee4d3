"""attention_with_kvcache(): decoding against a KV cache, contiguous or paged, with FlashAttention's
flash_attn_with_kvcache arguments; mla_decode_with_kvcache(): MLA decoding over a latent cache, with FlashMLA's
flash_mla_with_kvcache arguments."""

import operator

import torch

from .. import _lib
from .._lib import FlashgenArgumentError
from ._autograd import _eager_call
from ._calls import _warm_sinks
from ._checks import (_bad, _check_alibi, _check_cache_scales, _check_chunk, _check_kvcache_inputs, _check_scale,
                      _check_sinks, _check_softcap, _mask_and_window)
from ._kvcache_calls import _kvcache, _planned_kvcache
from ._variants import no_variant, user_variant, variant_op_arguments


def attention_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None, cache_seqlens=None,
                           cache_batch_idx=None, cache_leftpad=None, block_table=None, softmax_scale=None,
                           causal=False, window_size=(-1, -1), softcap=0.0, rotary_interleaved=True,
                           alibi_slopes=None, num_splits=0, return_softmax_lse=False, *, causal_align="bottom_right",
                           sinks=None, attention_chunk=0, mask_mod=None, score_mod=None, score_grad=None,
                           score_bias=None, variant_helpers=None, variant_args=None, mask_same_for_heads=False,
                           k_scale=None, v_scale=None):
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
    skip with; score_grad and mask_same_for_heads are accepted and unused); traced, they are the op
    flashgen::variant_attention_kvcache (torch.compile keeps them in its graph). rotary embeddings, cache_batch_idx and cache_leftpad are not supported yet (a
    value other than the default is refused).

    An FP8 cache (vLLM's kv_cache_dtype "fp8"): k_cache and v_cache both torch.float8_e4m3fn or both
    torch.float8_e5m2 (q, k, v and out stay float16 or bfloat16; head_dim a multiple of 32 up to 256; sm_89 and newer;
    not a latent cache), each key standing for its value times k_scale and each value for its own times v_scale
    (keyword only): CUDA float32 tensors on q's device of shape () or [1] (one scale for the cache), [heads_kv] (one
    per kv head) or [batch, heads_kv] (one per sequence and kv head), None for 1. New tokens k and v are appended as
    k / k_scale and v / v_scale rounded to the nearest FP8 value (saturated at the format's largest, ±448 for e4m3,
    ±57344 for e5m2). The scales are read on the device at each call (a graph replay sees their current values) and
    refused with a 16-bit cache.

    A latent cache (MLA's, DeepSeek's 576 = 512 + 64 rope columns; mla_decode_with_kvcache takes FlashMLA's
    arguments for it): v_cache a view k_cache[..., :head_dim_v] of the keys' first columns (same data and strides),
    head_dim_v a multiple of 128 up to 512 and at least 64 below the keys' (a multiple of 64 in [192, 576]); out then
    has head_dim_v columns, and new tokens are appended as k alone (v=None: their values are k's first columns).
    Hopper (sm_90) only.

    Returns out [batch, seqlen_q, heads_q, head_dim_v] (a new tensor; head_dim_v is v_cache's head dim, head_dim
    but for a latent cache), or (out, lse) with return_softmax_lse, lse being fp32 [batch, heads_q, seqlen_q]. Not
    differentiable (a sinks parameter that requires grad is read detached). Runs on the current CUDA stream of q's
    device as the custom op flashgen::attention_kvcache (torch.compile keeps it; its split workspace comes from torch's
    allocator, so a CUDA graph captures it). cache_seqlens and block_table are read on the device only and clamped
    into the caches: wrong values give wrong rows, never an access outside them.
    """
    if rotary_cos is not None or rotary_sin is not None or cache_batch_idx is not None or cache_leftpad is not None:
        unsupported = {"rotary_cos": rotary_cos, "rotary_sin": rotary_sin, "cache_batch_idx": cache_batch_idx,
                       "cache_leftpad": cache_leftpad}
        name = next(name for name, given in unsupported.items() if given is not None)
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
    # Eager calls take the kept ctypes arguments in either backend: the KV-cache op asks the library for its split
    # workspace at every call, a plan takes it from flashgen's pool (bench/notes_torch.md §7, §12).
    if (no_variant(mask_mod, score_mod, score_grad, score_bias, variant_helpers, variant_args)
            and _eager_call(q, k_cache, v_cache)
            and all(t is None or isinstance(t, torch.Tensor) for t in (k, v, cache_seqlens, block_table, sinks,
                                                                        alibi_slopes, k_scale, v_scale))):
        # The warm call of a signature seen before: its plan's key holds all that the checks below look at.
        planned = _planned_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, block_table, scale, mask, num_splits,
                                   window, _warm_sinks(sinks), chunk, softcap, alibi_slopes, create=False,
                                   want_lse=return_softmax_lse, k_scale=k_scale, v_scale=v_scale)
        if planned is not None:
            return planned if return_softmax_lse else planned[0]
    _check_kvcache_inputs(q, k_cache, v_cache, k, v, cache_seqlens, block_table)
    sinks = _check_sinks(sinks, q.device, q.shape[2])
    if sinks is not None:  # no autograd node for a model's sinks parameter: the op has no backward
        sinks = sinks.detach()
    alibi_slopes = _check_alibi(alibi_slopes, q.device, q.shape[0], q.shape[2])
    k_scale, v_scale = _check_cache_scales(q, k_cache, v_cache, k_scale, v_scale)
    args = (q, k_cache, v_cache, k, v, cache_seqlens, block_table, scale, mask, num_splits)
    if _eager_call(q, k_cache, v_cache):
        user = user_variant(q.device, mask_mod, score_mod, score_grad, score_bias, variant_helpers, variant_args,
                            mask_same_for_heads)
        out, lse = _kvcache(*args, window, sinks, chunk, softcap, alibi_slopes, user=user, k_scale=k_scale,
                            v_scale=v_scale)
    else:  # traced (torch.compile, torch.export, a dispatch mode): the ops, a user variant's included
        variant = variant_op_arguments(q.device, mask_mod, score_mod, score_grad, score_bias, variant_helpers,
                                       variant_args, mask_same_for_heads)
        if variant is not None:
            out, lse = torch.ops.flashgen.variant_attention_kvcache(*args, *window, sinks, chunk, softcap,
                                                                    alibi_slopes, *variant, k_scale, v_scale)
        else:
            out, lse = torch.ops.flashgen.attention_kvcache(*args, *window, sinks, chunk, softcap, alibi_slopes,
                                                            k_scale, v_scale)
    return (out, lse) if return_softmax_lse else out


# The checked (mask, window, chunk, scale, softcap) of decode_step's argument values, each set checked once.
_DECODE_ARGUMENTS = {}


def decode_step(q, k_cache, v_cache, softmax_scale, causal, window_size, softcap, sinks, attention_chunk):
    """An integration's decode step (transformers'): attention_with_kvcache(q, k_cache, v_cache, softmax_scale=...,
    causal=..., window_size=..., softcap=..., sinks=..., attention_chunk=...) over q [batch, heads_q, seqlen_q,
    head_dim] and caches [batch, heads_kv, keys, head_dim] read in place, giving out [batch, seqlen_q, heads_q,
    head_dim]. The numbers are checked once per set of values and the tensors once per signature, as
    attention_with_kvcache checks them; a warm call goes straight to its signature's plan."""
    given = (softmax_scale, causal, window_size, softcap, attention_chunk)
    checked = _DECODE_ARGUMENTS.get(given)
    if checked is None:
        mask, window = _mask_and_window(causal, "bottom_right", window_size)
        checked = (mask, window, _check_chunk(attention_chunk, mask), _check_scale(softmax_scale),
                   _check_softcap(softcap))
        if len(_DECODE_ARGUMENTS) >= 256:
            _DECODE_ARGUMENTS.clear()
        _DECODE_ARGUMENTS[given] = checked
    mask, window, chunk, scale, cap = checked
    if _eager_call(q, k_cache, v_cache) and (sinks is None or isinstance(sinks, torch.Tensor)):
        planned_sinks = _warm_sinks(sinks)
        args = (q, k_cache, v_cache, None, None, None, None, scale, mask, 0, window, planned_sinks, chunk, cap, None)
        planned = _planned_kvcache(*args, create=False, want_lse=False, layout="bhsd")
        if planned is None:  # a new signature: checked as attention_with_kvcache checks its tensors, then planned
            _check_kvcache_inputs(*(t.transpose(1, 2) for t in (q, k_cache, v_cache)), None, None, None, None)
            _check_sinks(sinks, q.device, q.shape[1])
            planned = _planned_kvcache(*args, create=True, want_lse=False, layout="bhsd")
        if planned is not None:
            return planned[0]
    return attention_with_kvcache(*(t.transpose(1, 2) for t in (q, k_cache, v_cache)), softmax_scale=softmax_scale,
                                  causal=causal, window_size=window_size, softcap=softcap, sinks=sinks,
                                  attention_chunk=attention_chunk)


def mla_decode_with_kvcache(q, kv_cache, block_table, cache_seqlens, head_dim_v=512, softmax_scale=None, causal=False,
                            num_splits=0, return_softmax_lse=True, *, q_pe=None):
    """MLA decoding (DeepSeek's) over a latent KV cache with FlashMLA's flash_mla_with_kvcache arguments: q [batch,
    seqlen_q, heads_q, head_dim] (head_dim = 576: the 512 latent columns absorbed, then the 64 rope columns), or with
    q_pe (keyword only) q as q_nope [batch, seqlen_q, heads_q, head_dim_v] and q_pe [batch, seqlen_q, heads_q,
    head_dim - head_dim_v], joined into one contiguous q before the call; kv_cache [num_pages, page_size, heads_kv,
    head_dim] read through block_table (int32 [batch, max_pages]; page_size a multiple of 16, FlashMLA's 64 among
    them), or with block_table=None a contiguous cache [batch, capacity, heads_kv, head_dim]; cache_seqlens: int32
    [batch] keys in each sequence's cache, the new tokens' included (FlashMLA's meaning: they are in the cache
    already). The keys are kv_cache's rows, the values their first head_dim_v columns (read in place, never copied).
    causal=True aligns each sequence's queries with its last keys (FlashMLA's and FlashAttention's alignment);
    softmax_scale None for 1/sqrt(head_dim). FlashMLA's tile_scheduler_metadata and num_splits (get_mla_metadata's)
    are not needed: flashgen plans the key ranges itself; num_splits here is attention_with_kvcache's (0: chosen for
    the GPU and problem, 1: batch-invariant results). One or more kv heads (query heads are packed per kv head).

    Returns (out [batch, seqlen_q, heads_q, head_dim_v], lse fp32 [batch, heads_q, seqlen_q]) as FlashMLA does, or
    out alone with return_softmax_lse=False. The call is attention_with_kvcache(q, kv_cache, kv_cache[...,
    :head_dim_v], cache_seqlens=cache_seqlens, block_table=block_table, ...), and runs as it does (the custom op
    flashgen::attention_kvcache, CUDA graphs, torch.compile). Hopper (sm_90) only: elsewhere the library refuses
    the call, saying that the latent kernel needs sm_90.
    """
    if not isinstance(kv_cache, torch.Tensor) or kv_cache.dim() != 4:
        got = f"shape {tuple(kv_cache.shape)}" if isinstance(kv_cache, torch.Tensor) else type(kv_cache).__name__
        _bad(f"kv_cache: expected a 4-d tensor [num_pages, page_size, heads_kv, head_dim] (with a block_table) or "
             f"[batch, capacity, heads_kv, head_dim], got {got}")
    head_dim = kv_cache.shape[3]
    try:
        dim_v = operator.index(head_dim_v)
    except TypeError:
        dim_v = None
    if dim_v is None or isinstance(head_dim_v, bool):
        _bad(f"head_dim_v: expected an int, got {type(head_dim_v).__name__}")
    if not 0 < dim_v < head_dim:
        _bad(f"head_dim_v = {dim_v} must be below kv_cache.shape[3] (head_dim) = {head_dim}: the values are the "
             f"latent's first head_dim_v columns, the keys all {head_dim}")
    if q_pe is not None:
        q = _joined_query(q, q_pe, head_dim, dim_v)
    return attention_with_kvcache(q, kv_cache, kv_cache[..., :dim_v], cache_seqlens=cache_seqlens,
                                  block_table=block_table, softmax_scale=softmax_scale, causal=causal,
                                  num_splits=num_splits, return_softmax_lse=return_softmax_lse)


def _joined_query(q_nope, q_pe, head_dim, head_dim_v):
    """mla_decode_with_kvcache's q from q_nope [..., head_dim_v] and q_pe [..., head_dim - head_dim_v]: one
    contiguous [batch, seqlen_q, heads_q, head_dim] tensor, its columns q_nope's then q_pe's."""
    def got(t):
        return f"shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__

    if not isinstance(q_nope, torch.Tensor) or q_nope.dim() != 4 or q_nope.shape[3] != head_dim_v:
        _bad(f"q: with q_pe given, q is q_nope [batch, seqlen_q, heads_q, head_dim_v = {head_dim_v}], got "
             f"{got(q_nope)}")
    rope = head_dim - head_dim_v
    if not isinstance(q_pe, torch.Tensor) or q_pe.dim() != 4 or q_pe.shape[3] != rope:
        _bad(f"q_pe: expected [batch, seqlen_q, heads_q, head_dim - head_dim_v = {rope}] (kv_cache's head_dim "
             f"{head_dim}), got {got(q_pe)}")
    if q_pe.shape[:3] != q_nope.shape[:3]:
        _bad(f"q_pe: its [batch, seqlen_q, heads_q] are {list(q_pe.shape[:3])} but q's (q_nope's) are "
             f"{list(q_nope.shape[:3])}")
    if q_pe.dtype != q_nope.dtype or q_pe.device != q_nope.device:
        _bad(f"q_pe is {q_pe.dtype} on {q_pe.device} but q (q_nope) is {q_nope.dtype} on {q_nope.device}")
    return torch.cat((q_nope, q_pe), dim=-1)
