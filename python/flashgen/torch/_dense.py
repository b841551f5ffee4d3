"""attention(), explain() and tune(): dense batches, [batch, seqlen, heads, head_dim] or SDPA's layout."""

import ctypes

import torch

from .. import _lib
from ._autograd import _Empty, _eager_call, _user_variant_call, differentiable_forward
from ._calls import _BackwardCall, _ForwardCall, _backward_kernels, _forward, _planned_forward, _stream, _warm_sinks
from ._checks import (_DTYPE_CODES, _FP8_CODES, _MASK_CODES, _NO_DESCALES, _autocast, _bshd_shape, _check_alibi,
                      _check_chunk, _check_fp8_forward, _check_fp8_no_grad, _check_inputs, _check_out_dtype,
                      _check_scale, _check_sinks, _check_softcap, _deterministic, _lse_shape, _mask, _mask_and_window,
                      _out_dtype_name, _out_shape, _records_autograd)
from ._variants import no_variant, user_variant, variant_op_arguments


# Signatures of plain eager calls (no variant, slopes or sinks) whose arguments passed the checks: everything the
# checks look at, so that a later call of one goes straight to the kernels. Bounded: cleared at 4096.
_CHECKED = set()


def attention(q, k, v, *, causal=False, causal_align="bottom_right", scale=None, layout="bshd", deterministic=False,
              return_lse=False, softcap=0.0, window_size=(-1, -1), attention_chunk=0, alibi_slopes=None, sinks=None,
              mask_mod=None, score_mod=None, score_grad=None, score_bias=None, variant_helpers=None,
              variant_args=None, mask_same_for_heads=False, block_mask=None, q_descale=None, k_descale=None,
              v_descale=None, out_dtype=None):
    """softmax(q kᵀ · scale [causal mask]) v on CUDA float16 / bfloat16 tensors, differentiable in q, k and v (and
    the attention sinks); forward only, FP8 q, k and v with FlashAttention-3's descales.

    q: [batch, seqlen_q, heads_q, head_dim] ("bshd") or [batch, heads_q, seqlen_q, head_dim] ("bhsd", the layout
    of torch's scaled_dot_product_attention). k, v: the same with seqlen_k and heads_kv; heads_q must be a
    multiple of heads_kv (grouped-query attention: query head h reads key/value head h // (heads_q // heads_kv)).
    head_dim a multiple of 8 up to 256 (up to 512 on Hopper GPUs). v may have a head_dim of its own, a
    multiple of 8 up to 512 (MLA's prefill: q and k of 192, v of 128; FA3's 64 and 512, the widest on Hopper GPUs
    only), and out then has it, forward and backward. Any strides work without a copy as long as head_dim is contiguous, the other strides are multiples of 8
    elements and the data 16-byte aligned; other inputs are copied first.

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
    with NVRTC's messages at the body's own lines); the tensors and numbers may change from call to call. Under
    torch.compile (fullgraph included) and torch.export such calls go into the graph as flashgen::variant_attention_*
    ops, the description a constant of the graph (a block_mask is not used there). Each pass classifies the mask's
    blocks first (small kernels per call) and skips those with no visible key: per head, or once per batch entry with
    mask_same_for_heads=True, which a mask_mod that ignores head may set (the backward skips fewer for a mask whose
    visible blocks do not grow with the row). block_mask=flashgen.torch.BlockMask(): classes kept across calls, as
    FlexAttention's block mask: the calls of one step that share it (a model's layers, with the same mask_mod and
    variant_args) classify once per shape and pass; make a new one when variant_args' tensors change contents.

        doc = torch.tensor(document_ids, dtype=torch.int32, device="cuda")
        out = flashgen.torch.attention(q, k, v, causal=True, mask_mod="return doc[q_idx] == doc[kv_idx];",
                                       variant_args={"doc": doc})

    FP8 q, k and v (FlashAttention-3's FP8 forward; Hopper, sm_90): all three torch.float8_e4m3fn or all three
    torch.float8_e5m2, head_dim a multiple of 16 up to 256 (v of q's head_dim), each standing for its codes times its
    descale: q_descale, k_descale, v_descale (keyword only, FlashAttention-3's names), float32 tensors on q's device of
    shape [batch, heads_kv] (entry [b, h] scales batch entry b's kv head h, and the query heads that read it), or of
    any shape that broadcasts to it (a scalar tensor expanded to [batch, heads_kv] with zero strides, as vLLM and
    SGLang pass one; [heads_kv]), read on the device through their own strides at each call; None for 1. out is
    out_dtype, torch.bfloat16 (the default, FlashAttention-3's) or torch.float16. The kernels round the softmax's
    probabilities to e4m3 before P·V, as FlashAttention-3's do. Forward only: such a call refuses q, k, v or sinks
    that require grad (under torch.no_grad() they may), and descales with 16-bit q, k and v (whose out is of their
    own dtype: out_dtype must then be None or q.dtype); not with a user variant. Masks, windows, chunks, the soft
    cap, ALiBi and sinks as above. Under torch.compile it is the op flashgen::attention_forward with its descales.

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
    named_none = no_variant(mask_mod, score_mod, score_grad, score_bias, variant_helpers, variant_args, block_mask)
    # FP8 q, k and v take a forward-only path of their own; so do descales, which 16-bit ones refuse there by name.
    if (isinstance(q, torch.Tensor) and q.dtype in _FP8_CODES) or not (q_descale is None and k_descale is None
                                                                       and v_descale is None):
        out, lse = _fp8_forward(q, k, v, scale, mask, layout, softcap, window, chunk, alibi_slopes, sinks,
                                (q_descale, k_descale, v_descale), out_dtype, named_none, return_lse)
        return (out, lse) if return_lse else out
    if out_dtype is not None and isinstance(q, torch.Tensor):
        _check_out_dtype(out_dtype, q)  # 16-bit q, k and v give out of their own dtype, the one it may name
    # Without autograd a warm call's kept ctypes arguments are the cheapest path in either backend (bench/notes_torch.md
    # §3: about 2/3 of the C++ op's host time); with autograd the op library's kernels are.
    if (named_none and _eager_call(q, k, v)
            and all(t is None or isinstance(t, torch.Tensor) for t in (alibi_slopes, sinks))
            and not (torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, sinks)))):
        # The warm call of a signature seen before: its plan's key holds all that _check_inputs looks at (and the
        # slopes' and sinks' layout).
        planned = _planned_forward(q, k, v, scale, mask, layout, softcap, window, chunk, False, create=False,
                                   want_lse=return_lse, alibi_slopes=alibi_slopes, sinks=_warm_sinks(sinks))
        if planned is not None:
            return planned if return_lse else planned[0]
    plain = named_none and alibi_slopes is None and sinks is None and _eager_call(q, k, v)
    if plain:
        signature = (layout, q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.device, k.device, v.device)
        if signature in _CHECKED:  # passed the checks below before: straight to the kernels
            args = (q, k, v, scale, mask, layout, _deterministic(deterministic), softcap, *window, None, None, chunk)
            if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
                out, lse = differentiable_forward(*args)
            else:
                out, lse = _forward(q, k, v, scale, mask, layout, checked=True, softcap=softcap, window=window,
                                    attention_chunk=chunk)
            return (out, lse) if return_lse else out
    _check_inputs(q, k, v, layout)
    batch, heads_q, _ = _lse_shape(q, layout)
    alibi_slopes = _check_alibi(alibi_slopes, q.device, batch, heads_q)
    sinks = _check_sinks(sinks, q.device, heads_q)  # float32 here, so autograd converts the gradient back
    if not _eager_call(q, k, v) and q.numel() != 0 and k.numel() != 0:
        # Traced (torch.compile, torch.export, a dispatch mode): a user variant goes into the graph as the variant op.
        variant = variant_op_arguments(q.device, mask_mod, score_mod, score_grad, score_bias, variant_helpers,
                                       variant_args, mask_same_for_heads, block_mask)
        if variant is not None:
            out, lse = torch.ops.flashgen.variant_attention_forward(
                q, k, v, scale, mask, layout, _deterministic(deterministic), softcap, *window, alibi_slopes, sinks,
                chunk, *variant)
            return (out, lse) if return_lse else out
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
        if plain:
            if len(_CHECKED) >= 4096:
                _CHECKED.clear()
            _CHECKED.add(signature)
        args = (q, k, v, scale, mask, layout, _deterministic(deterministic), softcap, *window, alibi_slopes, sinks,
                chunk)
        if not _eager_call(q, k, v):
            out, lse = torch.ops.flashgen.attention_forward(*args)
        elif torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, sinks)):
            out, lse = differentiable_forward(*args)
        else:  # nothing to differentiate: no autograd node at all, and the kept ctypes arguments of the signature
            out, lse = _forward(q, k, v, scale, mask, layout, checked=True, softcap=softcap, window=window,
                                alibi_slopes=alibi_slopes, sinks=sinks, attention_chunk=chunk)
    return (out, lse) if return_lse else out


def _fp8_forward(q, k, v, scale, mask, layout, softcap, window, chunk, alibi_slopes, sinks, descales, out_dtype,
                 named_none, want_lse):
    """(out, lse) of attention() over FP8 q, k and v (or given descales, which 16-bit ones refuse): forward only, no
    autograd node. A warm eager call goes straight to its plan (whose key holds the descales' layout and the output
    dtype); want_lse=False lets it skip lse (None then)."""
    if descales[0] is None and descales[1] is None and descales[2] is None:
        descales = _NO_DESCALES  # as the checks give it, which the plans' keys hold
    if (named_none and _eager_call(q, k, v) and not _records_autograd(q, k, v, sinks)
            and all(t is None or isinstance(t, torch.Tensor) for t in (alibi_slopes, sinks, *descales))
            and (out_dtype is None or (isinstance(out_dtype, torch.dtype) and out_dtype in _DTYPE_CODES))):
        planned = _planned_forward(q, k, v, scale, mask, layout, softcap, window, chunk, False, create=False,
                                   want_lse=want_lse, alibi_slopes=alibi_slopes, sinks=_warm_sinks(sinks),
                                   descales=descales, out_dtype=out_dtype or torch.bfloat16)
        if planned is not None:
            return planned
    _check_inputs(q, k, v, layout, True)
    descales, out_dtype = _check_fp8_forward(q, k, layout, descales, out_dtype)
    _check_fp8_no_grad(q, k, v, sinks, "flashgen.torch.attention")
    if not named_none:
        raise _lib.FlashgenArgumentError("flashgen.torch.attention: FP8 q, k and v do not take a user variant "
                                         "(mask_mod, score_mod, score_bias, variant_args, block_mask) here",
                                         _lib.ERROR_UNSUPPORTED)
    batch, heads_q, _ = _lse_shape(q, layout)
    alibi_slopes = _check_alibi(alibi_slopes, q.device, batch, heads_q)
    sinks = _check_sinks(sinks, q.device, heads_q)
    if q.numel() == 0 or k.numel() == 0:  # no kernel: out 0, lse -inf (each head's sink, with sinks)
        lse = torch.full(_lse_shape(q, layout), float("-inf"), dtype=torch.float32, device=q.device)
        if sinks is not None:
            lse.copy_(sinks[None, :, None])
        return torch.zeros(_out_shape(q, v), dtype=out_dtype, device=q.device), lse
    if not _eager_call(q, k, v):  # traced: the op, with its fake kernel's output dtype
        return torch.ops.flashgen.attention_forward(q, k, v, scale, mask, layout, False, softcap, *window,
                                                    alibi_slopes, sinks, chunk, *descales, _out_dtype_name(out_dtype))
    return _forward(q, k, v, scale, mask, layout, checked=True, softcap=softcap, window=window,
                    alibi_slopes=alibi_slopes, sinks=sinks, attention_chunk=chunk, descales=descales,
                    out_dtype=out_dtype)


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
