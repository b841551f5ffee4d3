"""The KV-cache call over torch tensors: its flashgen_kvcache_args, the warm calls' kept arguments (_KvCachePlan), the
split workspace (torch's allocator's, or for a warm call outside a graph capture flashgen's pool), and the call itself.
"""

import ctypes

import torch

from .. import _lib
from ._calls import (_Plans, _current_device, _layout_key, _options, _plannable_extras, _plans, _readable, _stream,
                     _stream_handle, _strides_readable, _view)
from ._checks import _BSHD_DIMS, _NO_WINDOW, _check_alibi, _check_cache_scales, _check_sinks, _scale_strides


def _kvcache_args(q, k_cache, v_cache, k, v, cache_seqlens, block_table, out, lse, scale, mask, num_splits, window,
                  sinks, attention_chunk=0, softcap=0.0, alibi_slopes=None, user=None, layout="bshd", k_scale=None,
                  v_scale=None):
    """flashgen_kvcache_args over the tensors (each readable in place: the caches are written in place when k and
    v are given, so they are never copied); sinks, alibi_slopes and an FP8 cache's k_scale and v_scale checked; user:
    a _variants.UserVariant or None; layout: q's and the contiguous caches' ("bhsd": [batch, heads, seqlen,
    head_dim]), out and k, v being bshd. v is None where k is appended to a latent cache (its values are k's first
    columns)."""
    args = _lib.KvCacheArgs()
    args.size = ctypes.sizeof(args)
    args.q, args.k_cache, args.v_cache = (_view(t, layout) for t in (q, k_cache, v_cache))
    args.out = _view(out, "bshd")
    if k is not None:
        args.k_new = _view(k, "bshd")
    if v is not None:
        args.v_new = _view(v, "bshd")
    args.lse = lse.data_ptr()
    args.cache_seqlens = cache_seqlens.data_ptr() if cache_seqlens is not None else None
    if block_table is not None:
        args.block_table, args.max_pages = block_table.data_ptr(), block_table.shape[1]
    args.num_splits = num_splits
    args.options = _options(scale, mask, False, softcap, window, alibi_slopes, sinks,
                            attention_chunk=attention_chunk, user=user)
    if k_scale is not None:
        args.k_scale, args.k_scale_stride = k_scale.data_ptr(), (ctypes.c_int64 * 2)(*_scale_strides(k_scale))
    if v_scale is not None:
        args.v_scale, args.v_scale_stride = v_scale.data_ptr(), (ctypes.c_int64 * 2)(*_scale_strides(v_scale))
    return args


# Split workspace bytes the library asked for, per problem class (everything of a call but its data): a warm call
# asks the library once, not twice. Cleared when it grows past 4096 classes.
_KVCACHE_WORKSPACE = {}


def _kvcache_class(q, k_cache, v_cache, k, cache_seqlens, block_table, scale, mask, num_splits, window, sinks,
                   attention_chunk=0, softcap=0.0, alibi_slopes=None, user=None, k_scale=None, v_scale=None):
    return (q.device, q.dtype, tuple(q.shape), q.stride(), k_cache.dtype, tuple(k_cache.shape), k_cache.stride(),
            v_cache.dtype, tuple(v_cache.shape), v_cache.stride(), k_scale is None, v_scale is None,
            None if k is None else (tuple(k.shape), k.stride()),
            None if block_table is None else tuple(block_table.shape), cache_seqlens is None, scale, mask, num_splits,
            window, sinks is None, attention_chunk, softcap, alibi_slopes is None,
            None if user is None else user.handle)


def _word(field, subfield=None, index=0):
    """The index of a field of flashgen_kvcache_args in the struct read as int64 words (every field a warm call
    re-points is an 8-byte pointer or count, 8-byte aligned)."""
    offset = getattr(_lib.KvCacheArgs, field).offset
    if subfield is not None:
        kind = _lib.Tensor if field != "options" else _lib.AttentionOptions
        offset += getattr(kind, subfield).offset + 8 * index
    assert offset % 8 == 0
    return offset // 8


# The words a warm call writes: data pointers, and a cache's capacity and strides (its shape[1] and stride[0..2]).
_Q, _OUT, _LSE = _word("q", "data"), _word("out", "data"), _word("lse")
_CACHES = tuple((_word(name, "data"), _word(name, "shape", 1), _word(name, "stride", 0))
                for name in ("k_cache", "v_cache"))
_K_NEW, _V_NEW = _word("k_new", "data"), _word("v_new", "data")
_CACHE_SEQLENS, _BLOCK_TABLE = _word("cache_seqlens"), _word("block_table")
_WORKSPACE, _WORKSPACE_BYTES = _word("workspace"), _word("workspace_bytes")
_SINKS, _ALIBI_SLOPES = _word("options", "sinks"), _word("options", "alibi_slopes")
_K_SCALE, _V_SCALE = _word("k_scale"), _word("v_scale")

try:  # whether the current device's current stream captures a CUDA graph, without building a torch.cuda.Stream
    _capturing = torch._C._cuda_isCurrentStreamCapturing
except AttributeError:
    _capturing = torch.cuda.is_current_stream_capturing


class _KvCachePlan:
    """The KvCacheArgs of one KV-cache call signature without a user variant, built once and re-pointed at each
    call's tensors (as _ForwardPlan) through `words`, the struct as int64 words: q, out, lse, the caches, and where
    the call has them the appended tokens, the block table, the sinks, the ALiBi slopes and an FP8 cache's scales
    (whose shapes and strides are the signature's, and so are their C strides). The caches' capacity and strides are
    not part of the signature: transformers' cache grows by a token per generated token, so they change at every step,
    and the plan rewrites them. The split workspace comes from flashgen's pool, which needs no size
    query when the cache grew; while a CUDA graph is captured (or q is on another than the current device, where
    capture cannot be asked cheaply) it comes from torch's allocator, the size asked again when the caches' layout
    changed. layout: q's and the caches' (out is [batch, seqlen_q, heads_q, head_dim_v] either way, head_dim_v being
    v_cache's last dim)."""

    __slots__ = ("args", "args_ref", "words", "dims", "out_shape", "lse_shape", "workspace_for", "workspace_bytes",
                 "call", "size_call")

    def __init__(self, q, k_cache, v_cache, k, v, out, lse, cache_seqlens, block_table, scale, mask, num_splits,
                 window, sinks, attention_chunk, softcap, alibi_slopes, layout, k_scale, v_scale):
        self.args = _kvcache_args(q, k_cache, v_cache, k, v, cache_seqlens, block_table, out, lse, scale, mask,
                                  num_splits, window, sinks, attention_chunk, softcap, alibi_slopes, layout=layout,
                                  k_scale=k_scale, v_scale=v_scale)
        self.args_ref = ctypes.byref(self.args)
        self.words = (ctypes.c_int64 * (ctypes.sizeof(self.args) // 8)).from_buffer(self.args)
        self.dims = _BSHD_DIMS[layout]
        self.out_shape, self.lse_shape = tuple(out.shape), tuple(lse.shape)
        self.workspace_for = None  # the caches' (shape, strides) workspace_bytes was asked for
        self.workspace_bytes = 0
        self.call = _lib.function("flashgen_attention_kvcache")
        self.size_call = _lib.function("flashgen_attention_kvcache_workspace_size")

    def torch_workspace(self, k_cache, v_cache, stream, device):
        """The split workspace from torch's allocator (a CUDA graph's pool while one is captured), or None for none;
        its pointer and size written into the arguments."""
        words = self.words
        words[_WORKSPACE] = words[_WORKSPACE_BYTES] = 0
        layout = (k_cache.shape, k_cache.stride(), v_cache.stride())
        if self.workspace_for != layout:
            size = ctypes.c_size_t(0)
            _lib.check(self.size_call(self.args_ref, stream, ctypes.byref(size)),
                       "flashgen_attention_kvcache_workspace_size")
            self.workspace_for, self.workspace_bytes = layout, size.value
        if self.workspace_bytes == 0:
            return None
        workspace = torch.empty(self.workspace_bytes, dtype=torch.uint8, device=device)
        words[_WORKSPACE], words[_WORKSPACE_BYTES] = workspace.data_ptr(), self.workspace_bytes
        return workspace


def _kvcache_plan_key(q, k_cache, v_cache, k, v, cache_seqlens, block_table, scale, mask, num_splits, window, sinks,
                      attention_chunk, softcap, alibi_slopes, layout, k_scale, v_scale):
    capacity = _BSHD_DIMS[layout][1]  # the one size of the caches a plan rewrites
    return (layout, q.shape, q.stride(), q.dtype, q.device, k_cache.shape[:capacity], k_cache.shape[capacity + 1:],
            k_cache.dtype, k_cache.device, v_cache.shape[:capacity], v_cache.shape[capacity + 1:], v_cache.dtype,
            v_cache.device,
            None if cache_seqlens is None else (cache_seqlens.shape, cache_seqlens.dtype, cache_seqlens.device), scale,
            mask, num_splits, window, attention_chunk, softcap, _layout_key(k), _layout_key(v),
            _layout_key(block_table), _layout_key(sinks), _layout_key(alibi_slopes), _layout_key(k_scale),
            _layout_key(v_scale))


def _planned_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, block_table, scale, mask, num_splits, window, sinks,
                     attention_chunk, softcap, alibi_slopes, create, want_lse=True, layout="bshd", k_scale=None,
                     v_scale=None):
    """(out, lse) of a KV-cache call through its signature's _KvCachePlan (see there for which calls), or None where
    the call takes the full path: q, k or v not readable in place, a block table that is not contiguous, sinks that
    are not float32, a legacy default stream on another device, or (create=False) no plan yet. A plan exists only
    for a signature whose arguments passed the checks; the optional tensors must be tensors (or None). With
    want_lse=False the kernels write no lse and the call returns (out, None). layout "bhsd": q and contiguous caches
    [batch, heads, seqlen, head_dim] (no k, v or block table); out is [batch, seqlen_q, heads_q, head_dim_v], its
    head dim v_cache's (a latent cache's values are narrower than its keys). An FP8 cache's k_scale and v_scale are
    checked when the plan is made (the op's callers reach here unchecked) and re-pointed at each call."""
    key = _kvcache_plan_key(q, k_cache, v_cache, k, v, cache_seqlens, block_table, scale, mask, num_splits, window,
                            sinks, attention_chunk, softcap, alibi_slopes, layout, k_scale, v_scale)
    plans = _plans.kvcache
    plan = plans.get(key)
    if plan is None and not create:
        return None
    device = q.device
    stream = _stream_handle(device)
    aligned = q.data_ptr() | (0 if k is None else k.data_ptr()) | (0 if v is None else v.data_ptr())
    on_current_device = device.index == _current_device()
    if (aligned & 15) or (stream == 0 and not on_current_device):
        return None
    if plan is None:
        if not all(_strides_readable(t) for t in (q, k, v) if t is not None):
            return None
        if block_table is not None and not block_table.is_contiguous():
            return None
        batch, seqlen_q, heads_q, _ = (q.shape[i] for i in _BSHD_DIMS[layout])
        if not _plannable_extras(alibi_slopes, sinks, device, batch, heads_q):
            return None
        if k_scale is not None or v_scale is not None:
            _check_cache_scales(q, k_cache, v_cache, k_scale, v_scale, layout)
        out = q.new_empty((batch, seqlen_q, heads_q, v_cache.shape[-1]))
        lse = torch.empty((batch, heads_q, seqlen_q), dtype=torch.float32, device=device)
        if len(plans) >= _Plans.limit:
            plans.clear()
        plan = plans[key] = _KvCachePlan(q, k_cache, v_cache, k, v, out, lse, cache_seqlens, block_table, scale, mask,
                                         num_splits, window, sinks, attention_chunk, softcap, alibi_slopes, layout,
                                         k_scale, v_scale)
    else:
        out = q.new_empty(plan.out_shape)
        lse = torch.empty(plan.lse_shape, dtype=torch.float32, device=device) if want_lse else None
    words = plan.words
    words[_Q], words[_OUT] = q.data_ptr(), out.data_ptr()
    words[_LSE] = 0 if lse is None else lse.data_ptr()
    row, seq, head, _ = plan.dims
    for (data, capacity, strides), cache in zip(_CACHES, (k_cache, v_cache)):
        stride = cache.stride()
        words[data], words[capacity] = cache.data_ptr(), cache.shape[seq]
        words[strides], words[strides + 1], words[strides + 2] = stride[row], stride[seq], stride[head]
    if cache_seqlens is not None:
        words[_CACHE_SEQLENS] = cache_seqlens.data_ptr()
    if k is not None:
        words[_K_NEW] = k.data_ptr()
    if v is not None:
        words[_V_NEW] = v.data_ptr()
    if block_table is not None:
        words[_BLOCK_TABLE] = block_table.data_ptr()
    if sinks is not None:
        words[_SINKS] = sinks.data_ptr()
    if alibi_slopes is not None:
        words[_ALIBI_SLOPES] = alibi_slopes.data_ptr()
    if k_scale is not None:
        words[_K_SCALE] = k_scale.data_ptr()
    if v_scale is not None:
        words[_V_SCALE] = v_scale.data_ptr()
    workspace = None
    if on_current_device and not _capturing():
        words[_WORKSPACE] = words[_WORKSPACE_BYTES] = 0  # flashgen's pool
    else:
        workspace = plan.torch_workspace(k_cache, v_cache, stream, device)
    status = plan.call(plan.args_ref, stream)
    if status != _lib.SUCCESS:
        plan.workspace_for = None  # a choice made since may want another workspace: ask again next time
        _lib.check(status, "flashgen_attention_kvcache")
    del workspace  # held until the call is queued
    return out, lse


def _kvcache(q, k_cache, v_cache, k, v, cache_seqlens, block_table, scale, mask, num_splits, window=_NO_WINDOW,
             sinks=None, attention_chunk=0, softcap=0.0, alibi_slopes=None, user=None, k_scale=None, v_scale=None):
    if user is None:
        planned = _planned_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, block_table, scale, mask, num_splits,
                                   window, sinks, attention_chunk, softcap, alibi_slopes, create=True,
                                   k_scale=k_scale, v_scale=v_scale)
        if planned is not None:
            return planned
    with torch.cuda.device(q.device):
        sinks = _check_sinks(sinks, q.device, q.shape[2])
        alibi_slopes = _check_alibi(alibi_slopes, q.device, q.shape[0], q.shape[2])
        k_scale, v_scale = _check_cache_scales(q, k_cache, v_cache, k_scale, v_scale)
        q = _readable(q)
        k, v = (None if t is None else _readable(t) for t in (k, v))
        block_table = block_table.contiguous() if block_table is not None else None
        out = torch.empty((*q.shape[:-1], v_cache.shape[-1]), dtype=q.dtype, device=q.device)
        lse = torch.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32, device=q.device)
        args = _kvcache_args(q, k_cache, v_cache, k, v, cache_seqlens, block_table, out, lse, scale, mask, num_splits,
                             window, sinks, attention_chunk, softcap, alibi_slopes, user, k_scale=k_scale,
                             v_scale=v_scale)
        stream = _stream(q.device)
        key = _kvcache_class(q, k_cache, v_cache, k, cache_seqlens, block_table, scale, mask, num_splits, window,
                             sinks, attention_chunk, softcap, alibi_slopes, user, k_scale, v_scale)
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
