"""The C calls of flashgen.torch over torch tensors (dense and packed, forward and backward): the flashgen_tensor
views and options of a call, the warm calls' kept ctypes arguments (_ForwardPlan), and the calls themselves. Tensors
are passed by pointer and strides, never copied, unless the kernels cannot read them in place (head_dim not
unit-stride, other strides not multiples of 16 bytes, data not 16-byte aligned). The custom ops, autograd and
public functions are built on these, and _sdpa's overrides of PyTorch's flash-attention kernels.
"""

import ctypes
import threading

import torch

from .. import _lib
from ._checks import (_BSHD_DIMS, _DTYPE_CODES, _FP8_CODES, _MASK_CODES, _NO_DESCALES, _NO_WINDOW, _TENSOR_CODES,
                      _check_alibi, _check_fp8_forward, _check_inputs, _check_lse, _check_mask, _check_out_dtype,
                      _check_sinks, _descale_strides, _lse_shape, _out_shape)

# The options' fields of the FP8 forward's descales, in the order q_descale, k_descale, v_descale.
_DESCALE_FIELDS = (("q_descale", "q_descale_stride"), ("k_descale", "k_descale_stride"),
                   ("v_descale", "v_descale_stride"))


def _options(scale, mask, deterministic, softcap, window, alibi_slopes, sinks=None, dsinks=None, attention_chunk=0,
             user=None, descales=_NO_DESCALES):
    """flashgen_attention_options of a call; alibi_slopes, sinks, dsinks (checked), user (a _variants.UserVariant)
    and descales (the FP8 forward's q_descale, k_descale and v_descale, each checked or None) must stay alive until
    the call is queued."""
    options = _lib.AttentionOptions(scale, _MASK_CODES[mask], 1 if deterministic else 0, softcap, *window)
    options.attention_chunk = attention_chunk
    if alibi_slopes is not None:
        options.alibi_slopes = alibi_slopes.data_ptr()
        options.alibi_batch_stride = alibi_slopes.stride(0) if alibi_slopes.dim() == 2 else 0
    if sinks is not None:
        options.sinks = sinks.data_ptr()
    if dsinks is not None:
        options.dsinks = dsinks.data_ptr()
    if user is not None:
        user.apply(options)
    if descales is not _NO_DESCALES:
        for descale, (pointer, strides) in zip(descales, _DESCALE_FIELDS):
            if descale is not None:
                setattr(options, pointer, descale.data_ptr())
                setattr(options, strides, (ctypes.c_int64 * 2)(*_descale_strides(descale)))
    return options


def _point_descales(options, descales):
    """A warm call's descales into options whose strides were set for the same layout (_options)."""
    for descale, (pointer, _) in zip(descales, _DESCALE_FIELDS):
        if descale is not None:
            setattr(options, pointer, descale.data_ptr())


def _strides_readable(t):
    """Whether the kernels can read t through its strides: head_dim contiguous, the other strides multiples of 16
    bytes (8 elements of 16 bits, 16 FP8 ones)."""
    step = 16 if t.dtype in _FP8_CODES else 8
    return t.stride(-1) == 1 and all(size == 1 or stride % step == 0
                                     for size, stride in zip(t.shape[:-1], t.stride()[:-1]))


def _readable(t):
    """t when the kernels can read it in place, else a fresh contiguous copy in the same layout."""
    if t.data_ptr() % 16 == 0 and _strides_readable(t):
        return t
    return torch.empty(t.shape, dtype=t.dtype, device=t.device).copy_(t)


def _view(t, layout):
    """flashgen_tensor over t, read as [batch, seqlen, heads, head_dim] through t's own strides (an FP8 KV cache's
    too)."""
    dims = _BSHD_DIMS[layout]
    shape, stride = t.shape, t.stride()
    return _lib.Tensor(t.data_ptr(), _TENSOR_CODES[t.dtype], tuple(shape[i] for i in dims),
                       tuple(stride[i] for i in dims))


def _stream(device):
    """The caller's current stream on device, as the C ABI takes it."""
    return ctypes.c_void_p(torch.cuda.current_stream(device).cuda_stream)


try:  # the current stream's handle as an int without building a torch.cuda.Stream (what Inductor's code calls)
    _raw_stream = torch._C._cuda_getCurrentRawStream
except AttributeError:
    _raw_stream = None


_current_device = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)


def _stream_handle(device):
    """_stream(device) as an int, the cheap way where torch has one (a tensor's device always has its index)."""
    return _raw_stream(device.index) if _raw_stream is not None else torch.cuda.current_stream(device).cuda_stream


class _ForwardCall:
    """The arguments of one flashgen_attention_forward call: readable q, k, v, a fresh out (q's shape, contiguous;
    of out_dtype, the FP8 forward's, else q's dtype) and lse (fp32 [batch, heads_q, seqlen_q]), their views and the
    options (with the FP8 forward's checked descales). Build it under the device's guard."""

    def __init__(self, q, k, v, scale, mask, layout, softcap=0.0, window=_NO_WINDOW, alibi_slopes=None, sinks=None,
                 attention_chunk=0, out_like_q=False, user=None, descales=_NO_DESCALES, out_dtype=None):
        self.q, self.k, self.v = (_readable(t) for t in (q, k, v))
        # out_like_q: out takes q's strides (torch.empty_like), as aten's flash-attention ops promise their callers;
        # values of a head dim of their own give out that head_dim (contiguous).
        same_dims = v.shape[-1] == q.shape[-1]
        out_dtype = _check_out_dtype(out_dtype, q)
        self.out = (torch.empty_like(q) if out_like_q and same_dims and out_dtype == q.dtype
                    else torch.empty(_out_shape(q, v), dtype=out_dtype, device=q.device))
        self.lse = torch.empty(_lse_shape(q, layout), dtype=torch.float32, device=q.device)
        self.views = [_view(t, layout) for t in (self.q, self.k, self.v, self.out)]
        batch, heads_q, _ = _lse_shape(q, layout)
        self.alibi_slopes = _check_alibi(alibi_slopes, q.device, batch, heads_q)
        self.sinks = _check_sinks(sinks, q.device, heads_q)
        self.user = user
        self.descales = descales
        self.options = _options(scale, mask, False, softcap, window, self.alibi_slopes, self.sinks,
                                attention_chunk=attention_chunk, user=user, descales=descales)

    def arguments(self):
        return (*(ctypes.byref(view) for view in self.views), ctypes.c_void_p(self.lse.data_ptr()),
                ctypes.byref(self.options))


class _ForwardPlan:
    """The ctypes arguments of flashgen_attention_forward for one call signature (sizes, strides, dtype, device,
    options, and the layout of the ALiBi slopes, sinks and the FP8 forward's descales where the call has them), built
    once and re-pointed at each call's tensors: a model calls attention with the same signature again and again, and
    building the views and options is most of a call's Python cost."""

    __slots__ = ("views", "tensor_refs", "options", "options_ref", "lse_shape", "function", "out_like_q", "out_shape",
                 "out_dtype")

    def __init__(self, q, k, v, out, scale, mask, layout, softcap, window, attention_chunk, alibi_slopes=None,
                 sinks=None, descales=_NO_DESCALES):
        self.views = [_view(t, layout) for t in (q, k, v, out)]
        # out is q's shape (its head_dim v's), contiguous (or like q, for aten's ops), of q's dtype or the FP8
        # forward's out_dtype: empty_like(q) allocates it the cheapest way wherever that gives the same tensor.
        self.out_like_q = out.shape == q.shape and out.stride() == q.stride() and out.dtype == q.dtype
        self.out_shape, self.out_dtype = out.shape, out.dtype
        self.tensor_refs = tuple(ctypes.byref(view) for view in self.views)
        self.options = _options(scale, mask, False, softcap, window, alibi_slopes, sinks,
                                attention_chunk=attention_chunk, descales=descales)
        self.options_ref = ctypes.byref(self.options)
        self.lse_shape = _lse_shape(q, layout)
        self.function = _lib.function("flashgen_attention_forward")


class _Plans(threading.local):
    """Each thread's plans (_ForwardPlan, _BackwardPlan, _KvCachePlan) by signature (per thread: a call stores its
    pointers into the plan's views, and ctypes releases the GIL while the library reads them). Bounded: a process that
    keeps making new signatures starts over."""

    limit = 256

    def __init__(self):
        self.forward = {}
        self.backward = {}
        self.kvcache = {}


_plans = _Plans()


def _layout_key(t):
    """What a plan fixes of an optional tensor argument: None, or its shape, strides, dtype and device."""
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device)


def _plannable_extras(alibi_slopes, sinks, device, batch, heads_q):
    """Whether a plan may hold the call's (checked) slopes and sinks as they are: sinks float32 and contiguous, slopes
    that _check_alibi passes unchanged. The full path passes converted copies of any others."""
    if sinks is not None and (sinks.dtype != torch.float32 or not sinks.is_contiguous()):
        return False
    return alibi_slopes is None or _check_alibi(alibi_slopes, device, batch, heads_q) is alibi_slopes


def _warm_sinks(sinks):
    """sinks as a warm call's plan key sees them: in the model's dtype (gpt-oss keeps them in bf16) converted to
    float32, as _check_sinks converts them on the full path."""
    if sinks is not None and sinks.dtype in (torch.bfloat16, torch.float16):
        return sinks.detach().float()
    return sinks


def _planned_forward(q, k, v, scale, mask, layout, softcap, window, attention_chunk, out_like_q, create=True,
                     want_lse=True, alibi_slopes=None, sinks=None, descales=_NO_DESCALES, out_dtype=None):
    """(out, lse) of a forward call through its signature's _ForwardPlan, or None where the call must take the full
    path (_ForwardCall): inputs the kernels cannot read in place, slopes or sinks the full path would convert, or
    (create=False) a signature without a plan yet. A plan exists only for a signature whose arguments passed the
    checks. Without want_lse the kernels write no lse (the C ABI's lse NULL) and lse is None. descales: the FP8
    forward's (q_descale, k_descale, v_descale), each None or checked, read through their own strides; out_dtype its
    output dtype (None: q's). The key holds every input's dtype and the output's, so that calls of one shape in
    another format (FP8 against 16-bit, e4m3 against e5m2, a bf16 against an fp16 output) never share a plan."""
    key = (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, k.dtype, v.dtype, q.device, scale,
           mask, layout, softcap, window, attention_chunk, out_like_q, _layout_key(alibi_slopes), _layout_key(sinks),
           None if descales is _NO_DESCALES else tuple(_layout_key(d) for d in descales), out_dtype)
    pointers = (q.data_ptr(), k.data_ptr(), v.data_ptr())
    if (pointers[0] | pointers[1] | pointers[2]) & 15:
        return None
    device = q.device
    stream = _stream_handle(device)
    # The library takes the CUDA context from the stream; on the legacy default stream (0) from the current device.
    if stream == 0 and device.index != _current_device():
        return None
    plans = _plans.forward
    plan = plans.get(key)
    if plan is None and not create:
        return None
    if plan is None:
        if not all(_strides_readable(t) for t in (q, k, v)):
            return None
        if not _plannable_extras(alibi_slopes, sinks, device, *_lse_shape(q, layout)[:2]):
            return None
        dtype = _check_out_dtype(out_dtype, q)
        out = (torch.empty_like(q) if out_like_q and v.shape[-1] == q.shape[-1] and dtype == q.dtype
               else torch.empty(_out_shape(q, v), dtype=dtype, device=device))
        if len(plans) >= _Plans.limit:
            plans.clear()
        plan = plans[key] = _ForwardPlan(q, k, v, out, scale, mask, layout, softcap, window, attention_chunk,
                                         alibi_slopes, sinks, descales)
    elif plan.out_like_q:
        out = torch.empty_like(q)
    else:
        out = torch.empty(plan.out_shape, dtype=plan.out_dtype, device=device)
    if alibi_slopes is not None:
        plan.options.alibi_slopes = alibi_slopes.data_ptr()
    if sinks is not None:
        plan.options.sinks = sinks.data_ptr()
    if descales is not _NO_DESCALES:
        _point_descales(plan.options, descales)
    lse = torch.empty(plan.lse_shape, dtype=torch.float32, device=device) if want_lse else None
    views = plan.views
    views[0].data, views[1].data, views[2].data = pointers
    views[3].data = out.data_ptr()
    status = plan.function(*plan.tensor_refs, lse.data_ptr() if want_lse else None, plan.options_ref, stream)
    if status != _lib.SUCCESS:
        _lib.check(status, "flashgen_attention_forward")
    return out, lse


class _BackwardCall:
    """The arguments of one backward call: readable dout, q, k, v, out; lse; fresh dq, dk, dv (contiguous, shaped
    like q, k, v) and dsinks (_dsinks); views and options. Build it under the device's guard."""

    def __init__(self, dout, q, k, v, out, lse, scale, mask, layout, deterministic, softcap=0.0, window=_NO_WINDOW,
                 alibi_slopes=None, sinks=None, attention_chunk=0, grads_like_inputs=False, user=None):
        self.dout, self.q, self.k, self.v, self.out = (_readable(t) for t in (dout, q, k, v, out))
        self.lse = lse.contiguous()
        # grads_like_inputs: dq, dk, dv take q's, k's and v's strides (torch.empty_like), as aten's backward ops do.
        self.dq, self.dk, self.dv = (torch.empty_like(t) if grads_like_inputs else
                                     torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
        tensors = (self.q, self.k, self.v, self.out, self.dout, self.dq, self.dk, self.dv)
        self.views = [_view(t, layout) for t in tensors]
        batch, heads_q, _ = _lse_shape(q, layout)
        self.alibi_slopes = _check_alibi(alibi_slopes, q.device, batch, heads_q)
        self.sinks = _check_sinks(sinks, q.device, heads_q)
        self.dsinks = _dsinks(q, heads_q, self.sinks)
        self.user = user
        self.options = _options(scale, mask, deterministic, softcap, window, self.alibi_slopes, self.sinks,
                                self.dsinks if self.sinks is not None else None, attention_chunk, user)

    def arguments(self):
        refs = [ctypes.byref(view) for view in self.views]
        return (*refs[:5], ctypes.c_void_p(self.lse.data_ptr()), *refs[5:], ctypes.byref(self.options))


def _dsinks(q, heads_q, sinks):
    """The backward ops' fourth output: a fresh fp32 [heads_q] for the sinks' gradient (the library writes every
    element) when the call has sinks, else an empty [0] (a custom op returns tensors, never None)."""
    return q.new_empty((heads_q if sinks is not None else 0,), dtype=torch.float32)


def _forward(q, k, v, scale, mask, layout, checked=False, softcap=0.0, window=_NO_WINDOW, alibi_slopes=None,
             sinks=None, attention_chunk=0, user=None, descales=_NO_DESCALES, out_dtype=None):
    """(out, lse): the forward op's implementation, also called directly by eager calls (checked: attention()
    has checked the arguments already). FP8 q, k and v (one format) take descales (q_descale, k_descale, v_descale,
    each None for 1) and give out of out_dtype (None: bfloat16); 16-bit ones give out of their own dtype."""
    if not checked:
        _check_inputs(q, k, v, layout, True)
        _check_mask(mask)
        descales, out_dtype = _check_fp8_forward(q, k, layout, descales, out_dtype)
        if out_dtype == q.dtype:  # a 16-bit call's: plans key it as None, as attention() passes it
            out_dtype = None
    if user is None:
        planned = _planned_forward(q, k, v, scale, mask, layout, softcap, window, attention_chunk, False,
                                   alibi_slopes=alibi_slopes, sinks=sinks, descales=descales, out_dtype=out_dtype)
        if planned is not None:
            return planned
    with torch.cuda.device(q.device):
        call = _ForwardCall(q, k, v, scale, mask, layout, softcap, window, alibi_slopes, sinks, attention_chunk,
                            user=user, descales=descales, out_dtype=out_dtype)
        _lib.check(_lib.function("flashgen_attention_forward")(*call.arguments(), _stream(q.device)),
                   "flashgen_attention_forward")
    return call.out, call.lse


class _BackwardPlan:
    """The ctypes arguments of flashgen_attention_backward_with_workspace for one call signature, built once (with the
    workspace size the library asks for) and re-pointed at each call's tensors, as _ForwardPlan is for the forward."""

    __slots__ = ("views", "refs", "options", "options_ref", "workspace_bytes", "function", "heads_q", "sinks")

    def __init__(self, call, workspace_bytes):
        self.views, self.options = call.views, call.options
        self.refs = tuple(ctypes.byref(view) for view in self.views)
        self.options_ref = ctypes.byref(self.options)
        self.workspace_bytes = workspace_bytes
        self.function = _lib.function("flashgen_attention_backward_with_workspace")
        self.heads_q = call.dsinks.shape[0]
        self.sinks = call.sinks is not None


def _backward_plan_key(dout, q, k, v, out, lse, scale, mask, layout, deterministic, softcap, window, alibi_slopes,
                       sinks, attention_chunk):
    return (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), out.stride(), dout.shape, dout.stride(),
            dout.dtype, q.dtype, k.dtype, v.dtype, q.device, k.device, v.device, lse.shape, lse.stride(), lse.dtype,
            lse.device, scale, mask, layout, bool(deterministic), softcap, window, attention_chunk,
            _layout_key(alibi_slopes), _layout_key(sinks))


def _planned_backward(key, dout, q, k, v, out, lse, alibi_slopes, sinks):
    """(dq, dk, dv, dsinks) through the plan of key, or None where the call takes the full path: no plan yet, data
    not 16-byte aligned, or a legacy default stream on another device."""
    plan = _plans.backward.get(key)
    if plan is None:
        return None
    pointers = (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), dout.data_ptr())
    if (pointers[0] | pointers[1] | pointers[2] | pointers[3] | pointers[4]) & 15:
        return None
    device = q.device
    stream = _stream_handle(device)
    if stream == 0 and device.index != _current_device():
        return None
    dq = torch.empty(q.shape, dtype=q.dtype, device=device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=device)
    dsinks = q.new_empty((plan.heads_q,), dtype=torch.float32)
    # The caching allocator hands out 512-byte aligned blocks; the library asks for 256.
    workspace = torch.empty(plan.workspace_bytes, dtype=torch.uint8, device=device)
    views = plan.views
    for view, pointer in zip(views, pointers):
        view.data = pointer
    views[5].data, views[6].data, views[7].data = dq.data_ptr(), dk.data_ptr(), dv.data_ptr()
    options = plan.options
    if alibi_slopes is not None:
        options.alibi_slopes = alibi_slopes.data_ptr()
    if plan.sinks:
        options.sinks, options.dsinks = sinks.data_ptr(), dsinks.data_ptr()
    refs = plan.refs
    status = plan.function(*refs[:5], lse.data_ptr(), *refs[5:], plan.options_ref, workspace.data_ptr(),
                           plan.workspace_bytes, stream)
    if status != _lib.SUCCESS:
        _plans.backward.pop(key, None)  # a choice made since may want another workspace: the full path asks again
        return None
    return dq, dk, dv, dsinks


def _backward_kernels(dout, q, k, v, out, lse, scale, mask, layout, deterministic, softcap=0.0, window=_NO_WINDOW,
                      alibi_slopes=None, sinks=None, attention_chunk=0, user=None):
    """(dq, dk, dv, dsinks): the backward op's implementation, also called directly by eager calls
    (_EagerAttention). The kernels' workspace is a torch allocation, so nothing is allocated behind the caching
    allocator (or a CUDA graph's pool). A call without a user variant whose signature was served before goes through
    its _BackwardPlan: that signature passed the checks below."""
    key = None
    if user is None:
        key = _backward_plan_key(dout, q, k, v, out, lse, scale, mask, layout, deterministic, softcap, window,
                                 alibi_slopes, sinks, attention_chunk)
        planned = _planned_backward(key, dout, q, k, v, out, lse, alibi_slopes, sinks)
        if planned is not None:
            return planned
    _check_inputs(q, k, v, layout)
    _check_mask(mask)
    _check_lse(lse, q, layout)
    with torch.cuda.device(q.device):
        call = _BackwardCall(dout, q, k, v, out, lse, scale, mask, layout, deterministic, softcap, window,
                             alibi_slopes, sinks, attention_chunk, user=user)
        stream = _stream(q.device)
        workspace_bytes = ctypes.c_size_t(0)
        _lib.check(_lib.function("flashgen_attention_backward_workspace_size")(
            *call.arguments(), stream, ctypes.byref(workspace_bytes)), "flashgen_attention_backward_workspace_size")
        # The caching allocator hands out 512-byte aligned blocks; the library asks for 256.
        workspace = torch.empty(workspace_bytes.value, dtype=torch.uint8, device=q.device)
        _lib.check(_lib.function("flashgen_attention_backward_with_workspace")(
            *call.arguments(), ctypes.c_void_p(workspace.data_ptr()), workspace_bytes.value, stream),
            "flashgen_attention_backward_with_workspace")
    if key is not None and _plannable_backward(call, dout, q, k, v, out, lse, alibi_slopes, sinks):
        if len(_plans.backward) >= _Plans.limit:
            _plans.backward.clear()
        _plans.backward[key] = _BackwardPlan(call, workspace_bytes.value)
    return call.dq, call.dk, call.dv, call.dsinks


def _plannable_backward(call, dout, q, k, v, out, lse, alibi_slopes, sinks):
    """Whether the full path read the caller's own tensors (nothing copied or converted): only then may a plan hold
    their layout and be re-pointed at later calls' tensors."""
    return (call.dout is dout and call.q is q and call.k is k and call.v is v and call.out is out and call.lse is lse
            and call.alibi_slopes is alibi_slopes and (sinks is None or call.sinks is sinks))


def _packed_view(t):
    """flashgen_tensor over a packed [total, heads, head_dim] tensor, as the one batch entry [1, total, heads, d]."""
    total = t.shape[0]
    return _lib.Tensor(t.data_ptr(), _TENSOR_CODES[t.dtype], (1, *t.shape), (t.stride(0) * total, *t.stride()))


def _varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, scale, mask,
                    block_table=None, softcap=0.0, window=_NO_WINDOW, alibi_slopes=None, sinks=None, attention_chunk=0,
                    user=None, descales=_NO_DESCALES, out_dtype=None):
    """(out, lse) of a packed forward; descales and out_dtype: the FP8 forward's, checked (_check_fp8_forward)."""
    with torch.cuda.device(q.device):
        q, k, v = (_readable(t) for t in (q, k, v))
        block_table = block_table.contiguous() if block_table is not None else None
        cu_seqlens_q, cu_seqlens_k = cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous()
        seqused_k = seqused_k.contiguous() if seqused_k is not None else None
        out = torch.empty(_out_shape(q, v), dtype=out_dtype or q.dtype, device=q.device)
        lse = torch.empty((q.shape[1], q.shape[0]), dtype=torch.float32, device=q.device)
        args = _lib.VarlenForwardArgs()
        args.size = ctypes.sizeof(args)
        args.q, args.out = _packed_view(q), _packed_view(out)
        if block_table is None:
            args.k, args.v = _packed_view(k), _packed_view(v)
        else:  # paged caches [num_pages, page_size, heads_kv, head_dim], read as they are
            args.k, args.v = _view(k, "bshd"), _view(v, "bshd")
            args.block_table, args.max_pages = block_table.data_ptr(), block_table.shape[1]
        args.lse = lse.data_ptr()
        args.cu_seqlens_q, args.cu_seqlens_k = cu_seqlens_q.data_ptr(), cu_seqlens_k.data_ptr()
        args.seqused_k = seqused_k.data_ptr() if seqused_k is not None else None
        args.batch = cu_seqlens_q.shape[0] - 1
        args.max_seqlen_q, args.max_seqlen_k = max_seqlen_q, max_seqlen_k
        alibi_slopes = _check_alibi(alibi_slopes, q.device, args.batch, q.shape[1])
        sinks = _check_sinks(sinks, q.device, q.shape[1])
        args.options = _options(scale, mask, False, softcap, window, alibi_slopes, sinks,
                                attention_chunk=attention_chunk, user=user, descales=descales)
        _lib.check(_lib.function("flashgen_attention_varlen_forward")(ctypes.byref(args), _stream(q.device)),
                   "flashgen_attention_varlen_forward")
    return out, lse


def _varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, mask,
                     deterministic, softcap=0.0, window=_NO_WINDOW, alibi_slopes=None, sinks=None, attention_chunk=0,
                     user=None):
    with torch.cuda.device(q.device):
        dout, q, k, v, out = (_readable(t) for t in (dout, q, k, v, out))
        dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
        args = _lib.VarlenBackwardArgs()
        args.size = ctypes.sizeof(args)
        args.q, args.k, args.v, args.out, args.dout, args.dq, args.dk, args.dv = (
            _packed_view(t) for t in (q, k, v, out, dout, dq, dk, dv))
        # Contiguous copies held until the call is queued: a copy freed once its pointer is taken could be handed to
        # the sinks' conversion or their gradient below and overwritten before the kernels read it.
        lse, cu_seqlens_q, cu_seqlens_k = lse.contiguous(), cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous()
        args.lse = lse.data_ptr()
        args.cu_seqlens_q, args.cu_seqlens_k = cu_seqlens_q.data_ptr(), cu_seqlens_k.data_ptr()
        args.batch = cu_seqlens_q.shape[0] - 1
        args.max_seqlen_q, args.max_seqlen_k = max_seqlen_q, max_seqlen_k
        alibi_slopes = _check_alibi(alibi_slopes, q.device, args.batch, q.shape[1])
        sinks = _check_sinks(sinks, q.device, q.shape[1])
        dsinks = _dsinks(q, q.shape[1], sinks)
        args.options = _options(scale, mask, deterministic, softcap, window, alibi_slopes, sinks,
                                dsinks if sinks is not None else None, attention_chunk, user)
        _lib.check(_lib.function("flashgen_attention_varlen_backward")(ctypes.byref(args), _stream(q.device)),
                   "flashgen_attention_varlen_backward")
    return dq, dk, dv, dsinks
