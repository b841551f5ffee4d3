"""Argument checks of flashgen.torch's calls: what the library cannot see (types, devices, ranks, dtypes, how the
shapes agree), each failure naming the caller's argument in the caller's layout; sizes, strides and alignment are the
library's to check. They run on fake tensors too, so torch.compile reports them while tracing.
"""

import operator

import torch

from .. import _lib
from .._lib import FlashgenArgumentError

_DTYPE_CODES = {torch.float16: _lib.FLOAT16, torch.bfloat16: _lib.BFLOAT16}
# The FP8 formats: a KV cache's k_cache and v_cache (each key or value standing for itself times its scale), and the
# forward's q, k and v, dense or packed (each standing for itself times its descale).
_FP8_CODES = {torch.float8_e4m3fn: _lib.FLOAT8_E4M3, torch.float8_e5m2: _lib.FLOAT8_E5M2}
_TENSOR_CODES = {**_DTYPE_CODES, **_FP8_CODES}  # every dtype a flashgen_tensor may carry
_MASK_CODES = {"none": _lib.MASK_NONE, "bottom_right": _lib.MASK_CAUSAL, "top_left": _lib.MASK_CAUSAL_TOP_LEFT,
               "window": _lib.MASK_SLIDING_WINDOW}
_NO_WINDOW = (-1, -1)
# Position of [batch, seqlen, heads, head_dim] in a tensor of each layout.
_BSHD_DIMS = {"bshd": (0, 1, 2, 3), "bhsd": (0, 2, 1, 3)}


def _mask(causal, causal_align):
    if causal_align not in ("bottom_right", "top_left"):
        raise FlashgenArgumentError(f"causal_align must be 'bottom_right' or 'top_left', got {causal_align!r}",
                                    _lib.ERROR_INVALID_ARGUMENT)
    return causal_align if causal else "none"


def _bshd_shape(t, layout):
    """t's (batch, seqlen, heads, head_dim)."""
    return tuple(t.shape[i] for i in _BSHD_DIMS[layout])


def _bad(message):
    raise FlashgenArgumentError(message, _lib.ERROR_INVALID_ARGUMENT)


def _out_shape(q, v):
    """The forward's output shape: q's, its head_dim (the last dim in either layout) v's."""
    return q.shape if v.shape[-1] == q.shape[-1] else (*q.shape[:-1], v.shape[-1])


def _lse_shape(q, layout):
    batch, seqlen_q, heads_q, _ = _bshd_shape(q, layout)
    return (batch, heads_q, seqlen_q)


def _check_qkv(q, k, v, rank, expected, kv_rank=None, kv_expected=None, names=("q", "k", "v"), fp8_kv=False,
               fp8_qkv=False):
    """q, k and v (called `names` in the messages): torch tensors of `rank` dims (`expected` describes them in the
    message; k and v kv_rank dims, kv_expected, where those are given), float16 or bfloat16, on one CUDA (or meta)
    device, of one dtype; with fp8_kv (a KV cache's k_cache and v_cache) k and v may be FP8 instead (the library checks
    that both are of one format); with fp8_qkv (the forward, dense or packed) q, k and v may all be FP8, of one format;
    FlashgenArgumentError naming the argument otherwise."""
    for i, (name, t) in enumerate(zip(names, (q, k, v))):
        if not isinstance(t, torch.Tensor):
            _bad(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        want, text = (rank, expected) if i == 0 or kv_rank is None else (kv_rank, kv_expected)
        if t.dim() != want:
            _bad(f"{name}: expected a {text}, got shape {tuple(t.shape)}")
        if t.dtype not in _DTYPE_CODES and not ((fp8_qkv or (fp8_kv and i > 0)) and t.dtype in _FP8_CODES):
            hint = (" (a KV cache also torch.float8_e4m3fn and torch.float8_e5m2)" if fp8_kv and i > 0 else
                    " (the forward also FP8 q, k and v: torch.float8_e4m3fn or torch.float8_e5m2)" if fp8_qkv else "")
            _bad(f"{name}.dtype is {t.dtype}; flashgen runs torch.float16 and torch.bfloat16{hint}")
        if t.device.type not in ("cuda", "meta"):  # meta: shapes only, through the fake kernels
            _bad(f"{name} is on {t.device}; flashgen runs on CUDA devices")
    for name, t in zip(names[1:], (k, v)):
        if t.dtype != q.dtype and not (fp8_kv and t.dtype in _FP8_CODES):
            fp8 = fp8_qkv and (t.dtype in _FP8_CODES or q.dtype in _FP8_CODES)
            one_format = " (FP8 q, k and v share one format)" if fp8 else ""
            _bad(f"{name}.dtype is {t.dtype} but q.dtype is {q.dtype}{one_format}")
        if t.device != q.device:
            _bad(f"{name} is on {t.device} but q is on {q.device}")


def _check_inputs(q, k, v, layout, fp8=False):
    """Raises FlashgenArgumentError naming the argument for what the library cannot see (types, devices, ranks,
    dtypes). fp8: the forward's, which also takes FP8 q, k and v (of one format)."""
    if layout not in ("bshd", "bhsd"):
        _bad(f"layout must be 'bshd' ([batch, seqlen, heads, head_dim]) or 'bhsd' ([batch, heads, seqlen, "
            f"head_dim]), got {layout!r}")
    order = "[batch, seqlen, heads, head_dim]" if layout == "bshd" else "[batch, heads, seqlen, head_dim]"
    _check_qkv(q, k, v, 4, f"4-d tensor {order} (layout {layout!r})", fp8_qkv=fp8)
    roles = ("batch", "seqlen", "heads", "head_dim")

    def dim(name, i):
        return f"{name}.shape[{_BSHD_DIMS[layout][i]}] ({roles[i]})"

    shapes = {name: _bshd_shape(t, layout) for name, t in (("q", q), ("k", k), ("v", v))}
    # v's head_dim may be its own (the library says which calls take one): the output takes it.
    for name, other, i in (("k", "q", 0), ("k", "q", 3), ("v", "q", 0), ("v", "k", 1), ("v", "k", 2)):
        if shapes[name][i] != shapes[other][i]:
            _bad(f"{dim(name, i)} is {shapes[name][i]} but {dim(other, i)} is {shapes[other][i]}")
    if shapes["k"][2] > 0 and shapes["q"][2] % shapes["k"][2] != 0:
        _bad(f"{dim('q', 2)} = {shapes['q'][2]} must be a multiple of {dim('k', 2)} = {shapes['k'][2]}")


def _check_mask(mask):
    if mask not in _MASK_CODES:
        raise FlashgenArgumentError(f"mask must be one of {sorted(_MASK_CODES)}, got {mask!r}",
                                    _lib.ERROR_INVALID_ARGUMENT)


def _check_scale(scale):
    """The scale argument as the ops take it: 0.0 for the default 1/sqrt(head_dim)."""
    if scale is None:
        return 0.0
    scale = float(scale)
    if not 0.0 < scale < float("inf"):
        raise FlashgenArgumentError(f"scale must be a positive finite number or None (1/sqrt(head_dim)), got {scale}",
                                    _lib.ERROR_INVALID_ARGUMENT)
    return scale


def _check_window(window_size):
    """window_size as the ops take it: a (left, right) pair of ints, each >= 0 or -1 for no bound on that side (and
    below 2^31: the C ABI's fields are int32)."""
    try:
        left, right = window_size
        window = (operator.index(left), operator.index(right))
    except (TypeError, ValueError):
        window = None
    if (window is None or isinstance(left, bool) or isinstance(right, bool) or min(window) < -1
            or max(window) >= 2 ** 31):
        _bad(f"window_size must be a (left, right) pair of ints, each >= 0 or -1 for no bound on that side, got "
             f"{window_size!r}")
    return window


def _mask_and_window(causal, causal_align, window_size):
    """(mask, window) as the ops take them, with FlashAttention's window_size semantics: (-1, -1) is no window, and
    causal=True makes a window's right side 0 (the library runs the window (-1, 0) as the bottom-right causal
    mask). A window is aligned bottom-right: it does not take causal_align="top_left"."""
    mask = _mask(causal, causal_align)
    window = _check_window(window_size)
    if window == _NO_WINDOW:
        return mask, window
    if mask == "top_left":
        _bad("window_size is aligned bottom-right, as FlashAttention's: it does not take causal_align='top_left'")
    return "window", (window[0], 0) if causal else window


def _check_chunk(attention_chunk, mask):
    """attention_chunk as the ops take it: an int >= 0 (0: none; below 2^31: the C ABI's field is int32). Chunks lie
    about the bottom-right diagonal, as Llama 4's and FlashAttention's: a chunk does not take the top-left causal
    mask."""
    try:
        chunk = operator.index(attention_chunk)
    except TypeError:
        chunk = None
    if chunk is None or isinstance(attention_chunk, bool) or not 0 <= chunk < 2 ** 31:
        _bad(f"attention_chunk must be an int >= 0 (keys per chunk; 0 for none), got {attention_chunk!r}")
    if chunk > 0 and mask == "top_left":
        _bad("attention_chunk: chunks are aligned bottom-right, as Llama 4's and FlashAttention's: they do not take "
             "causal_align='top_left'")
    return chunk


def _check_alibi(alibi_slopes, device, batch, heads_q):
    """alibi_slopes as the ops take them: None, or a CUDA float32 tensor [heads_q] or [batch, heads_q] on q's device
    (FlashAttention's alibi_slopes), returned with its last dimension contiguous."""
    if alibi_slopes is None:
        return None
    if not isinstance(alibi_slopes, torch.Tensor):
        _bad(f"alibi_slopes must be a torch.Tensor or None, got {type(alibi_slopes).__name__}")
    shapes = ((heads_q,), (batch, heads_q))
    if alibi_slopes.dtype != torch.float32 or tuple(alibi_slopes.shape) not in shapes:
        _bad(f"alibi_slopes must be float32 [heads_q] = [{heads_q}] or [batch, heads_q] = [{batch}, {heads_q}], got "
             f"{alibi_slopes.dtype} {list(alibi_slopes.shape)}")
    if alibi_slopes.device != device:
        _bad(f"alibi_slopes must be on {device} (q's device), got {alibi_slopes.device}")
    if alibi_slopes.stride(-1) != 1 or (alibi_slopes.dim() == 2 and alibi_slopes.stride(0) < heads_q):
        alibi_slopes = alibi_slopes.contiguous()
    return alibi_slopes


def _check_sinks(sinks, device, heads_q):
    """sinks as the ops take them: None, or a CUDA float32 tensor [heads_q] on q's device (gpt-oss's attention sinks,
    one logit per query head), contiguous. gpt-oss keeps them in the model's dtype: bfloat16 and float16 sinks are
    converted by .float(), through which autograd takes their gradient back to the caller's dtype."""
    if sinks is None:
        return None
    if not isinstance(sinks, torch.Tensor):
        _bad(f"sinks must be a torch.Tensor or None, got {type(sinks).__name__}")
    if sinks.dtype not in (torch.float32, torch.bfloat16, torch.float16) or tuple(sinks.shape) != (heads_q,):
        _bad(f"sinks must be float32 (or bfloat16, float16: converted) [heads_q] = [{heads_q}], got {sinks.dtype} "
             f"{list(sinks.shape)}")
    if sinks.device != device:
        _bad(f"sinks must be on {device} (q's device), got {sinks.device}")
    return sinks.float().contiguous()


def _check_softcap(softcap):
    """The softcap argument as the ops take it: 0.0 for none."""
    softcap = float(softcap) if softcap is not None else 0.0
    if not 0.0 <= softcap < float("inf"):
        raise FlashgenArgumentError(f"softcap must be 0.0 (none) or a positive finite cap, got {softcap}",
                                    _lib.ERROR_INVALID_ARGUMENT)
    return softcap


def _check_lse(lse, q, layout):
    expected = _lse_shape(q, layout)
    if lse.dtype != torch.float32 or tuple(lse.shape) != tuple(expected) or lse.device != q.device:
        raise FlashgenArgumentError(
            f"lse: expected float32 {list(expected)} on {q.device} as the forward returned it, got {lse.dtype} "
            f"{list(lse.shape)} on {lse.device}", _lib.ERROR_INVALID_ARGUMENT)


def _autocast(q, k, v):
    """Under torch.autocast on CUDA, inputs of another floating dtype than autocast's (float32 say) are cast to
    it, as scaled_dot_product_attention's are (FP8 ones are not); outside it the inputs as given (float32 is then
    refused)."""
    try:
        enabled, dtype = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    except (TypeError, AttributeError):  # torch 2.4's older spellings
        enabled, dtype = torch.is_autocast_enabled(), torch.get_autocast_gpu_dtype()
    if not enabled or dtype not in _DTYPE_CODES:
        return q, k, v
    # FP8 inputs stand for themselves times their descales: a cast would drop those, so they are left as they are.
    return tuple(t.to(dtype) if isinstance(t, torch.Tensor) and t.device.type == "cuda" and t.is_floating_point()
                 and t.dtype != dtype and t.dtype not in _FP8_CODES else t for t in (q, k, v))


def _deterministic(deterministic):
    """The backward's strategy: deterministic when asked for, or while torch.use_deterministic_algorithms(True)."""
    return bool(deterministic) or torch.are_deterministic_algorithms_enabled()


def _check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k,
                         block_table=None, fp8=False):
    """Raises FlashgenArgumentError naming the argument for what the library cannot see (types, devices, ranks,
    dtypes, the offsets' length); sizes, strides and the packing's ranges are the library's to check. fp8: the
    forward's, which also takes FP8 q, k and v (of one format)."""
    if block_table is None:
        _check_qkv(q, k, v, 3, "3-d packed tensor [total, heads, head_dim]", fp8_qkv=fp8)
    else:
        _check_qkv(q, k, v, 3, "3-d packed tensor [total, heads, head_dim]", 4,
                   "4-d paged cache [num_pages, page_size, heads_kv, head_dim] (with a block_table)", fp8_qkv=fp8)
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


def _latent_cache(k_cache, v_cache):
    """Whether the caches are a latent one (MLA's): values of a head dim of their own, which the library reads as
    the keys' first columns (v_cache a view of k_cache, as it checks)."""
    return v_cache.shape[-1] != k_cache.shape[-1]


def _check_kvcache_inputs(q, k_cache, v_cache, k, v, cache_seqlens, block_table):
    """Raises FlashgenArgumentError naming the argument for what the library cannot see (types, devices, ranks,
    dtypes of the int32 tensors); sizes, strides and the cache's shape are the library's to check. The caches are q's
    dtype or FP8 (the library checks that both share the format and what an FP8 cache takes). A latent cache takes its
    new tokens as k alone (their values are k's first columns)."""
    _check_qkv(q, k_cache, v_cache, 4, "4-d tensor (q: [batch, seqlen_q, heads_q, head_dim]; k_cache, v_cache: "
               "[batch, capacity, heads_kv, head_dim] or [num_pages, page_size, heads_kv, head_dim])",
               names=("q", "k_cache", "v_cache"), fp8_kv=True)
    if _latent_cache(k_cache, v_cache):
        if v is not None:
            _bad(f"v: a latent cache's new values are k's first {v_cache.shape[-1]} columns (v_cache is a view of "
                 f"k_cache's); pass k alone")
    elif (k is None) != (v is None):
        _bad("k and v: give both (the new tokens to append) or neither")
    if k is not None:
        _check_qkv(q, k, k if v is None else v, 4, "4-d tensor [batch, seqlen_new, heads_kv, head_dim]")
    for name, t, rank in (("cache_seqlens", cache_seqlens, 1), ("block_table", block_table, 2)):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != rank or t.device != q.device:
            _bad(f"{name}: expected a {rank}-d torch.int32 tensor on {q.device}, got "
                f"{t.dtype if isinstance(t, torch.Tensor) else type(t).__name__}"
                f"{' ' + str(list(t.shape)) + ' on ' + str(t.device) if isinstance(t, torch.Tensor) else ''}")
        if t.shape[0] != q.shape[0]:
            _bad(f"{name}.shape[0] is {t.shape[0]} but q.shape[0] (batch) is {q.shape[0]}")


def _fp8_scale_given(scale, name, scaled, scaled_name, sixteen_bit, whose):
    """Whether a scale of FP8 values was given (not None): refused when it is not a tensor, or when scaled (the tensor
    it scales, named scaled_name) is 16-bit, worded "name: given for <sixteen_bit> (...); <whose> (the FP8 dtypes)"."""
    if scale is None:
        return False
    if not isinstance(scale, torch.Tensor):
        _bad(f"{name} must be a torch.Tensor or None, got {type(scale).__name__}")
    if scaled.dtype not in _FP8_CODES:
        _bad(f"{name}: given for {sixteen_bit} ({scaled_name}.dtype is {scaled.dtype}); {whose} "
             "(torch.float8_e4m3fn, torch.float8_e5m2)")
    return True


def _check_cache_scale(scale, name, cache, cache_name, device, batch, heads_kv):
    """An FP8 cache's scale (k_scale of k_cache, v_scale of v_cache) as the ops take it: None, or a CUDA float32
    tensor on q's device of shape () or [1] (one for the tensor), [heads_kv] (one per kv head) or [batch, heads_kv]
    (one per sequence and kv head), returned detached (the KV-cache call has no gradient). Refused for a 16-bit
    cache."""
    if not _fp8_scale_given(scale, name, cache, cache_name, "a 16-bit cache", "scales are an FP8 cache's"):
        return None
    if scale.dtype != torch.float32 or tuple(scale.shape) not in ((), (1,), (heads_kv,), (batch, heads_kv)):
        _bad(f"{name} must be float32 of shape () or [1] (per tensor), [heads_kv] = [{heads_kv}] (per kv head) or "
             f"[batch, heads_kv] = [{batch}, {heads_kv}] (per sequence and kv head), got {scale.dtype} "
             f"{list(scale.shape)}")
    if scale.device != device:
        _bad(f"{name} must be on {device} (q's device), got {scale.device}")
    return scale.detach()


def _check_cache_scales(q, k_cache, v_cache, k_scale, v_scale, layout="bshd"):
    """(k_scale, v_scale) checked by _check_cache_scale over caches that passed _check_kvcache_inputs (layout: q's and
    the caches')."""
    batch, heads_kv = q.shape[0], k_cache.shape[_BSHD_DIMS[layout][2]]
    return (_check_cache_scale(k_scale, "k_scale", k_cache, "k_cache", q.device, batch, heads_kv),
            _check_cache_scale(v_scale, "v_scale", v_cache, "v_cache", q.device, batch, heads_kv))


def _scale_strides(scale):
    """A checked cache scale's (sequence, kv head) strides as the C ABI takes them: 0 over a dimension it shares."""
    if scale.dim() == 2:
        return tuple(0 if size == 1 else stride for size, stride in zip(scale.shape, scale.stride()))
    return (0, scale.stride(0) if scale.dim() == 1 and scale.shape[0] > 1 else 0)


# The FP8 forward's descales when a call gives none (each 1).
_NO_DESCALES = (None, None, None)


def _check_out_dtype(out_dtype, q):
    """The output dtype of a forward over q (checked): out_dtype, torch.bfloat16 or torch.float16, for FP8 q, k and v
    (None: torch.bfloat16, FlashAttention-3's); 16-bit q, k and v give out in their own dtype, where out_dtype must
    be None or q.dtype."""
    if out_dtype is not None and not (isinstance(out_dtype, torch.dtype) and out_dtype in _DTYPE_CODES):
        _bad(f"out_dtype must be torch.bfloat16 or torch.float16 (or None), got {out_dtype!r}")
    fp8 = q.dtype in _FP8_CODES
    if out_dtype is not None and not fp8 and out_dtype != q.dtype:
        _bad(f"out_dtype: 16-bit q, k and v give out in their own dtype (q.dtype is {q.dtype}), got {out_dtype}; "
             "out_dtype is an FP8 forward's")
    if out_dtype is not None:
        return out_dtype
    return torch.bfloat16 if fp8 else q.dtype


# The op's out_dtype argument: each output dtype by name ("" for None).
_OUT_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}


def _out_dtype_name(out_dtype):
    """The op's out_dtype for a checked out_dtype: its name, "" for None."""
    return "" if out_dtype is None else _OUT_DTYPE_NAMES[out_dtype]


def _out_dtype_of_name(name):
    """The out_dtype an op's out_dtype argument names (None for ""); an unknown name is refused."""
    if name == "":
        return None
    for dtype, dtype_name in _OUT_DTYPE_NAMES.items():
        if name == dtype_name:
            return dtype
    _bad(f"out_dtype must be 'bfloat16' or 'float16' (or '' for the default), got {name!r}")


def _broadcasts_to(shape, target):
    """Whether a tensor of shape broadcasts to target (torch's rule: dims aligned from the right, each 1 or the
    target's, none more than target has)."""
    if len(shape) > len(target):
        return False
    for i in range(1, len(shape) + 1):
        if shape[-i] != 1 and shape[-i] != target[-i]:
            return False
    return True


def _check_descale(descale, name, q, batch, heads_kv):
    """A descale of the FP8 forward (q_descale, k_descale or v_descale, FlashAttention-3's) as the ops take it: None,
    or a CUDA float32 tensor on q's device of shape [batch, heads_kv] or one that broadcasts to it (a scalar tensor
    expanded with zero strides, as vLLM and SGLang pass one; [heads_kv] per kv head; [batch, 1]), returned detached
    (no gradient reaches it). Refused for 16-bit q, k and v."""
    if not _fp8_scale_given(descale, name, q, "q", "16-bit q, k and v", "descales are an FP8 forward's"):
        return None
    if descale.dtype != torch.float32 or not _broadcasts_to(descale.shape, (batch, heads_kv)):
        _bad(f"{name} must be float32 of shape [batch, heads_kv] = [{batch}, {heads_kv}] or one that broadcasts to it "
             f"(FlashAttention-3's; a scalar tensor expanded to it, say), got {descale.dtype} {list(descale.shape)}")
    if descale.device != q.device:
        _bad(f"{name} must be on {q.device} (q's device), got {descale.device}")
    return descale.detach()


def _check_fp8_forward(q, k, layout, descales, out_dtype):
    """(descales, out_dtype) of a forward whose q, k and v passed _check_inputs(..., fp8=True): the three descales
    (q_descale, k_descale, v_descale) checked by _check_descale (_NO_DESCALES for none) and the output dtype by
    _check_out_dtype."""
    batch, _, heads_kv, _ = _bshd_shape(k, layout)
    return _checked_descales(q, descales, batch, heads_kv), _check_out_dtype(out_dtype, q)


def _check_varlen_fp8(q, k, cu_seqlens_q, descales, out_dtype):
    """As _check_fp8_forward, for a packed forward (k packed, or a paged cache with a block_table): descales per
    (sequence, kv head), so of shape [batch, heads_kv] with batch the sequences (cu_seqlens_q's length less one) or
    broadcast to it."""
    return _checked_descales(q, descales, cu_seqlens_q.shape[0] - 1, k.shape[-2]), _check_out_dtype(out_dtype, q)


def _checked_descales(q, descales, batch, heads_kv):
    """The three descales (q_descale, k_descale, v_descale) each checked by _check_descale against [batch, heads_kv];
    _NO_DESCALES for none."""
    names = ("q_descale", "k_descale", "v_descale")
    checked = tuple([_check_descale(descales[i], names[i], q, batch, heads_kv) for i in range(3)])
    return _NO_DESCALES if all(d is None for d in checked) else checked


def _descale_strides(descale):
    """A checked descale's (batch entry, kv head) strides as the C ABI takes them: 0 over a dimension it broadcasts
    (absent, or of size 1), else its own (an expanded tensor's are 0 already)."""
    shape, stride = descale.shape, descale.stride()
    rank = len(shape)
    return tuple(0 if i < 0 or shape[i] == 1 else stride[i] for i in (rank - 2, rank - 1))


def _records_autograd(*tensors):
    """Whether a call over these tensors (None for one not given) would record autograd."""
    if not torch.is_grad_enabled():
        return False
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.requires_grad:
            return True
    return False


def _check_fp8_no_grad(q, k, v, sinks, call):
    """Refuses an FP8 call (q, k and v FP8) that would record autograd: its forward has no backward, so a gradient
    through it would be wrong, not merely missing."""
    if not torch.is_grad_enabled():
        return
    for name, t in (("q", q), ("k", k), ("v", v), ("sinks", sinks)):
        if isinstance(t, torch.Tensor) and t.requires_grad:
            _bad(f"{call}: {name} requires grad, but {_FP8_NO_BACKWARD}")


# Why an FP8 call refuses autograd (the C++ autograd says the same, python/csrc/release/autograd.cpp).
_FP8_NO_BACKWARD = ("the FP8 forward has no backward (FlashAttention-3's neither): pass q, k, v and sinks that do not "
                    "require grad (detached), or call under torch.no_grad()")
