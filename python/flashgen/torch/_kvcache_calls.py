"""The KV-cache call over torch tensors: its flashgen_kvcache_args, the warm calls' kept arguments (_KvCachePlan), the
split workspace taken from torch's allocator, and the call itself.
"""

import ctypes

import torch

from .. import _lib
from ._autograd import _outside_graphs
from ._calls import (_Plans, _current_device, _layout_key, _options, _plannable_extras, _plans, _readable, _stream,
                     _stream_handle, _strides_readable, _view)
from ._checks import _NO_WINDOW, _check_alibi, _check_sinks


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
            window, sinks is None, attention_chunk, softcap, alibi_slopes is None,
            None if user is None else user.handle)


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
                     attention_chunk, softcap, alibi_slopes, create, want_lse=True):
    """(out, lse) of a KV-cache call through its signature's _KvCachePlan (see there for which calls), or None where
    the call takes the full path: q, k or v not readable in place, a block table that is not contiguous, sinks that
    are not float32, a legacy default stream on another device, or (create=False) no plan yet. A plan exists only
    for a signature whose arguments passed the checks; the optional tensors must be tensors (or None). With
    want_lse=False the kernels write no lse and the call returns (out, None)."""
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
        lse = torch.empty(plan.lse_shape, dtype=torch.float32, device=device) if want_lse else None
    args = plan.args
    args.q.data, args.out.data = q.data_ptr(), out.data_ptr()
    args.lse = None if lse is None else lse.data_ptr()
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
        _lib.check(_lib.function("flashgen_attention_kvcache_workspace_size")(plan.args_ref, stream,
                                                                            ctypes.byref(size)),
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


@_outside_graphs
def _kvcache_with_user(*args, user):
    """_kvcache of a call with a user variant, run eagerly (its functions and tensors are no op's arguments)."""
    return _kvcache(*args, user=user)
