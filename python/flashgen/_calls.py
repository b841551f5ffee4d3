"""The C calls of flashgen.torch over torch tensors: argument checks that the library cannot make (types, devices,
ranks, dtypes, how the shapes agree; naming the caller's argument), the flashgen_tensor views and options of a call,
the warm calls' kept ctypes arguments (_ForwardPlan), and the forward, backward and packed calls themselves.
flashgen.torch builds its custom ops, autograd and public functions on these, and flashgen._sdpa its overrides of
PyTorch's flash-attention kernels; this module imports neither.
"""

import ctypes
import operator
import threading

import torch

from . import _lib
from ._lib import FlashgenArgumentError

_DTYPE_CODES = {torch.float16: _lib.FLOAT16, torch.bfloat16: _lib.BFLOAT16}
_MASK_CODES = {"none": _lib.MASK_NONE, "bottom_right": _lib.MASK_CAUSAL, "top_left": _lib.MASK_CAUSAL_TOP_LEFT,
               "window": _lib.MASK_SLIDING_WINDOW}
_NO_WINDOW = (-1, -1)
# Position of [batch, seqlen, heads, head_dim] in a tensor of each layout.
_BSHD_DIMS = {"bshd": (0, 1, 2, 3), "bhsd": (0, 2, 1, 3)}


# ---------------------------------------------------------------------------------------------------------
# Argument checks: types, devices, ranks, dtypes and how the shapes agree here (on fake tensors too, so
# torch.compile reports them while tracing, and naming the caller's dims in either layout); sizes, strides and
# alignment in the library.

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


def _check_qkv(q, k, v, rank, expected, kv_rank=None, kv_expected=None):
    """q, k and v: torch tensors of `rank` dims (`expected` describes them in the message; k and v kv_rank dims,
    kv_expected, where those are given), float16 or bfloat16, on one CUDA (or meta) device, of one dtype;
    FlashgenArgumentError naming the argument otherwise."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            _bad(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        want, text = (rank, expected) if name == "q" or kv_rank is None else (kv_rank, kv_expected)
        if t.dim() != want:
            _bad(f"{name}: expected a {text}, got shape {tuple(t.shape)}")
        if t.dtype not in (torch.float16, torch.bfloat16):
            _bad(f"{name}.dtype is {t.dtype}; flashgen runs torch.float16 and torch.bfloat16")
        if t.device.type not in ("cuda", "meta"):  # meta: shapes only, through the fake kernels
            _bad(f"{name} is on {t.device}; flashgen runs on CUDA devices")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            _bad(f"{name}.dtype is {t.dtype} but q.dtype is {q.dtype}")
        if t.device != q.device:
            _bad(f"{name} is on {t.device} but q is on {q.device}")


def _check_inputs(q, k, v, layout):
    """Raises FlashgenArgumentError naming the argument for what the library cannot see (types, devices, ranks,
    dtypes)."""
    if layout not in ("bshd", "bhsd"):
        _bad(f"layout must be 'bshd' ([batch, seqlen, heads, head_dim]) or 'bhsd' ([batch, heads, seqlen, "
            f"head_dim]), got {layout!r}")
    order = "[batch, seqlen, heads, head_dim]" if layout == "bshd" else "[batch, heads, seqlen, head_dim]"
    _check_qkv(q, k, v, 4, f"4-d tensor {order} (layout {layout!r})")
    roles = ("batch", "seqlen", "heads", "head_dim")

    def dim(name, i):
        return f"{name}.shape[{_BSHD_DIMS[layout][i]}] ({roles[i]})"

    shapes = {name: _bshd_shape(t, layout) for name, t in (("q", q), ("k", k), ("v", v))}
    for name, other, i in (("k", "q", 0), ("k", "q", 3), ("v", "q", 0), ("v", "q", 3), ("v", "k", 1), ("v", "k", 2)):
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


def _options(scale, mask, deterministic, softcap, window, alibi_slopes, sinks=None, dsinks=None, attention_chunk=0,
             user=None):
    """flashgen_attention_options of a call; alibi_slopes, sinks, dsinks (checked) and user (a _variants.UserVariant)
    must stay alive until the call is queued."""
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
    return options


def _check_softcap(softcap):
    """The softcap argument as the ops take it: 0.0 for none."""
    softcap = float(softcap) if softcap is not None else 0.0
    if not 0.0 <= softcap < float("inf"):
        raise FlashgenArgumentError(f"softcap must be 0.0 (none) or a positive finite cap, got {softcap}",
                                    _lib.ERROR_INVALID_ARGUMENT)
    return softcap


# ---------------------------------------------------------------------------------------------------------
# The C calls. Tensors are passed by pointer and strides, never copied, unless the kernels cannot read them in
# place (head_dim not unit-stride, other strides not multiples of 8 elements, data not 16-byte aligned).

def _strides_readable(t):
    """Whether the kernels can read t through its strides: head_dim contiguous, the other strides multiples of 8."""
    return t.stride(-1) == 1 and all(size == 1 or stride % 8 == 0 for size, stride in zip(t.shape[:-1], t.stride()[:-1]))


def _readable(t):
    """t when the kernels can read it in place, else a fresh contiguous copy in the same layout."""
    if t.data_ptr() % 16 == 0 and _strides_readable(t):
        return t
    return torch.empty(t.shape, dtype=t.dtype, device=t.device).copy_(t)


def _view(t, layout):
    """flashgen_tensor over t, read as [batch, seqlen, heads, head_dim] through t's own strides."""
    dims = _BSHD_DIMS[layout]
    shape, stride = t.shape, t.stride()
    return _lib.Tensor(t.data_ptr(), _DTYPE_CODES[t.dtype], tuple(shape[i] for i in dims),
                       tuple(stride[i] for i in dims))


def _lse_shape(q, layout):
    batch, seqlen_q, heads_q, _ = _bshd_shape(q, layout)
    return (batch, heads_q, seqlen_q)


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
    """The arguments of one flashgen_attention_forward call: readable q, k, v, a fresh out (q's shape, contiguous)
    and lse (fp32 [batch, heads_q, seqlen_q]), their views and the options. Build it under the device's guard."""

    def __init__(self, q, k, v, scale, mask, layout, softcap=0.0, window=_NO_WINDOW, alibi_slopes=None, sinks=None,
                 attention_chunk=0, out_like_q=False, user=None):
        self.q, self.k, self.v = (_readable(t) for t in (q, k, v))
        # out_like_q: out takes q's strides (torch.empty_like), as aten's flash-attention ops promise their callers.
        self.out = torch.empty_like(q) if out_like_q else torch.empty(q.shape, dtype=q.dtype, device=q.device)
        self.lse = torch.empty(_lse_shape(q, layout), dtype=torch.float32, device=q.device)
        self.views = [_view(t, layout) for t in (self.q, self.k, self.v, self.out)]
        batch, heads_q, _ = _lse_shape(q, layout)
        self.alibi_slopes = _check_alibi(alibi_slopes, q.device, batch, heads_q)
        self.sinks = _check_sinks(sinks, q.device, heads_q)
        self.user = user
        self.options = _options(scale, mask, False, softcap, window, self.alibi_slopes, self.sinks,
                                attention_chunk=attention_chunk, user=user)

    def arguments(self):
        return (*(ctypes.byref(view) for view in self.views), ctypes.c_void_p(self.lse.data_ptr()),
                ctypes.byref(self.options))


class _ForwardPlan:
    """The ctypes arguments of flashgen_attention_forward for one call signature (sizes, strides, dtype, device,
    options, and the layout of the ALiBi slopes and sinks where the call has them), built once and re-pointed at each
    call's tensors: a model calls attention with the same signature again and again, and building the views and
    options is most of a call's Python cost."""

    __slots__ = ("views", "tensor_refs", "options", "options_ref", "lse_shape", "function", "out_like_q")

    def __init__(self, q, k, v, out, scale, mask, layout, softcap, window, attention_chunk, alibi_slopes=None,
                 sinks=None):
        self.views = [_view(t, layout) for t in (q, k, v, out)]
        # out is q's shape, contiguous (or like q, for aten's ops): empty_like(q) allocates it the cheapest way
        # wherever that gives the same strides.
        self.out_like_q = out.stride() == q.stride()
        self.tensor_refs = tuple(ctypes.byref(view) for view in self.views)
        self.options = _options(scale, mask, False, softcap, window, alibi_slopes, sinks,
                                attention_chunk=attention_chunk)
        self.options_ref = ctypes.byref(self.options)
        self.lse_shape = _lse_shape(q, layout)
        self.function = _lib.function("flashgen_attention_forward")


class _Plans(threading.local):
    """Each thread's _ForwardPlans by signature (per thread: a call stores its pointers into the plan's views, and
    ctypes releases the GIL while the library reads them). Bounded: a process that keeps making new signatures
    starts over."""

    limit = 256

    def __init__(self):
        self.forward = {}
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
                     want_lse=True, alibi_slopes=None, sinks=None):
    """(out, lse) of a forward call through its signature's _ForwardPlan, or None where the call must take the full
    path (_ForwardCall): inputs the kernels cannot read in place, slopes or sinks the full path would convert, or
    (create=False) a signature without a plan yet. A plan exists only for a signature whose arguments passed the
    checks. Without want_lse the kernels write no lse (the C ABI's lse NULL) and lse is None."""
    key = (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, q.device, scale, mask, layout,
           softcap, window, attention_chunk, out_like_q, _layout_key(alibi_slopes), _layout_key(sinks))
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
        out = torch.empty_like(q) if out_like_q else torch.empty(q.shape, dtype=q.dtype, device=device)
        if len(plans) >= _Plans.limit:
            plans.clear()
        plan = plans[key] = _ForwardPlan(q, k, v, out, scale, mask, layout, softcap, window, attention_chunk,
                                         alibi_slopes, sinks)
    elif plan.out_like_q:
        out = torch.empty_like(q)
    else:
        out = torch.empty(q.shape, dtype=q.dtype, device=device)
    if alibi_slopes is not None:
        plan.options.alibi_slopes = alibi_slopes.data_ptr()
    if sinks is not None:
        plan.options.sinks = sinks.data_ptr()
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


def _check_lse(lse, q, layout):
    expected = _lse_shape(q, layout)
    if lse.dtype != torch.float32 or tuple(lse.shape) != tuple(expected) or lse.device != q.device:
        raise FlashgenArgumentError(
            f"lse: expected float32 {list(expected)} on {q.device} as the forward returned it, got {lse.dtype} "
            f"{list(lse.shape)} on {lse.device}", _lib.ERROR_INVALID_ARGUMENT)


def _forward(q, k, v, scale, mask, layout, checked=False, softcap=0.0, window=_NO_WINDOW, alibi_slopes=None,
             sinks=None, attention_chunk=0, user=None):
    """(out, lse): the forward op's implementation, also called directly by eager calls (checked: attention()
    has checked the arguments already)."""
    if not checked:
        _check_inputs(q, k, v, layout)
        _check_mask(mask)
    if user is None:
        planned = _planned_forward(q, k, v, scale, mask, layout, softcap, window, attention_chunk, False,
                                   alibi_slopes=alibi_slopes, sinks=sinks)
        if planned is not None:
            return planned
    with torch.cuda.device(q.device):
        call = _ForwardCall(q, k, v, scale, mask, layout, softcap, window, alibi_slopes, sinks, attention_chunk,
                            user=user)
        _lib.check(_lib.function("flashgen_attention_forward")(*call.arguments(), _stream(q.device)),
                   "flashgen_attention_forward")
    return call.out, call.lse


def _backward_kernels(dout, q, k, v, out, lse, scale, mask, layout, deterministic, softcap=0.0, window=_NO_WINDOW,
                      alibi_slopes=None, sinks=None, attention_chunk=0, user=None):
    """(dq, dk, dv, dsinks): the backward op's implementation, also called directly by eager calls
    (_EagerAttention). The kernels' workspace is a torch allocation, so nothing is allocated behind the caching
    allocator (or a CUDA graph's pool)."""
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
    return call.dq, call.dk, call.dv, call.dsinks


def _packed_view(t):
    """flashgen_tensor over a packed [total, heads, head_dim] tensor, as the one batch entry [1, total, heads, d]."""
    total = t.shape[0]
    return _lib.Tensor(t.data_ptr(), _DTYPE_CODES[t.dtype], (1, *t.shape), (t.stride(0) * total, *t.stride()))


def _varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, scale, mask,
                    block_table=None, softcap=0.0, window=_NO_WINDOW, alibi_slopes=None, sinks=None, attention_chunk=0,
                    user=None):
    with torch.cuda.device(q.device):
        q, k, v = (_readable(t) for t in (q, k, v))
        block_table = block_table.contiguous() if block_table is not None else None
        cu_seqlens_q, cu_seqlens_k = cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous()
        seqused_k = seqused_k.contiguous() if seqused_k is not None else None
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
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
                                attention_chunk=attention_chunk, user=user)
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
