"""flashgen behind torch.nn.functional.scaled_dot_product_attention, for programs that are not edited: enable()
replaces the CUDA kernels of the two aten ops SDPA's flash-attention backend calls
(aten::_scaled_dot_product_flash_attention and its backward: C++ kernels of the release library where it is loaded,
python/csrc/release/sdpa.cpp, else the Python ones here), and of the FlashAttention-2 pair below them
(aten::_flash_attention_forward/backward: torch's varlen_attn, nested tensors), with flashgen's, through
torch.nn.attention's registry of flash-attention implementations where this torch has one (torch >= 2.10), else
through torch.library directly. A call flashgen cannot serve (dropout, a debug mask, a dtype, GPU or shape it
does not take, or an error of the library) runs torch's own kernel, captured before the override; sdpa_stats()
counts both. Only SDPA calls that choose the flash backend reach these ops: enable() puts that backend first in
SDPA's priority order while it is on (torch 2.11 prefers cuDNN on Hopper), and calls with an attn_mask go to
other backends as before. flashgen.torch exports enable, disable, sdpa_stats and reset_sdpa_stats.
"""

import collections
import ctypes
import threading

import torch

from .. import _lib
from . import _calls, _checks, _native

IMPLEMENTATION_NAME = "flashgen"  # the name in torch.nn.attention's registry

_FORWARD_OP = "_scaled_dot_product_flash_attention"
_BACKWARD_OP = "_scaled_dot_product_flash_attention_backward"
# Every op whose CUDA kernel enable() replaces: SDPA's pair, and the FlashAttention-2 pair below them that
# torch's varlen_attn and nested-tensor SDPA call (dense [batch, seqlen, heads, head_dim] or packed with offsets).
_OPS = (_FORWARD_OP, _BACKWARD_OP, "_flash_attention_forward", "_flash_attention_backward")


class _State:
    lock = threading.Lock()
    library = None      # the torch.library.Library holding the overrides while they are registered
    originals = None    # {op name: torch's own CUDA kernel (torch._C._SafeKernelFunction)}
    cuda_keys = None    # the dispatch key set the originals are called with
    through_registry = False
    saved_priority = None  # SDPA's backend priority order before enable(), restored by disable()
    counts = {"forward": collections.Counter(), "backward": collections.Counter()}
    last_error = None   # the library's message of the last call that fell back on an error


def _count(direction, outcome):
    with _State.lock:
        _State.counts[direction][outcome] += 1


def _unservable(q, k, v, dropout_p):
    """Why flashgen cannot take this call (a short reason, the key of sdpa_stats()), or None."""
    if dropout_p != 0.0:
        return "dropout"
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return "not 4-d (nested tensors)"
    if q.dtype not in (torch.float16, torch.bfloat16) or k.dtype != q.dtype or v.dtype != q.dtype:
        return "dtype"
    head_dim = q.shape[-1]
    if head_dim % 8 != 0 or head_dim > 256 or k.shape[-1] != head_dim or v.shape[-1] != head_dim:
        return "head_dim"
    if q.shape[1] % k.shape[1] != 0 or k.shape[1] != v.shape[1]:
        return "heads"
    if q.numel() == 0 or k.numel() == 0:
        return "empty"
    if q.device.index not in _SM80_OR_NEWER:
        _SM80_OR_NEWER[q.device.index] = torch.cuda.get_device_capability(q.device) >= (8, 0)
    if not _SM80_OR_NEWER[q.device.index]:
        return "GPU older than sm_80"
    return None


_SM80_OR_NEWER = {}  # device index -> whether flashgen runs there (asked once per device)


def _library_call(function_name, arguments):
    """Runs one C call; None on success, else the library's message (the caller falls back)."""
    status = _lib.function(function_name)(*arguments)
    if status == _lib.SUCCESS:
        return None
    return f"{function_name}: {_lib.STATUS_NAMES.get(status, status)}: {_lib.last_error()}"


_falling_back = threading.local()  # .active: this thread runs one of torch's kernels for a call that fell back


def _fall_back(direction, reason, op, *args, **kwargs):
    """Runs torch's own kernel of op, counting the call under reason. Torch's SDPA kernel calls the
    FlashAttention-2 op below it, which flashgen also overrides: inside a fallback that runs torch's kernel too,
    uncounted (one call, one count)."""
    if _inside_fallback():
        return _State.originals[op].call_boxed(_State.cuda_keys, *args, **kwargs)
    _count(direction, "fallback: " + reason)
    _falling_back.active = True
    try:
        return _State.originals[op].call_boxed(_State.cuda_keys, *args, **kwargs)
    finally:
        _falling_back.active = False


def _inside_fallback():
    """Whether this thread runs one of torch's kernels for a call that fell back, here or in the release library's
    overrides."""
    if getattr(_falling_back, "active", False):
        return True
    native = _native.release_library()
    return native is not None and native.flashgen_torch_sdpa_falling_back() != 0


def _forward_kernel(query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    """aten::_scaled_dot_product_flash_attention on CUDA: q, k, v [batch, heads, seqlen, head_dim]; returns (out like
    query, lse fp32 [batch, heads_q, seqlen_q], cum_seq_q, cum_seq_k, max_q, max_k, philox seed, philox offset,
    debug mask) as torch's kernel does. is_causal is SDPA's: aligned top-left."""
    mask = "top_left" if is_causal else "none"
    scale_value = 0.0 if scale is None else float(scale)
    planned, error = None, None
    if dropout_p == 0.0 and not return_debug_mask:  # a signature served before has its plan: no checks needed
        try:
            planned = _calls._planned_forward(query, key, value, scale_value, mask, "bhsd", 0.0,
                                              _checks._NO_WINDOW, 0, True, create=False)
        except _lib.FlashgenError as failure:
            error = str(failure)
    if planned is None and error is None:
        reason = "debug mask" if return_debug_mask else _unservable(query, key, value, dropout_p)
        if reason is not None:
            return _fall_back("forward", reason, _FORWARD_OP, query, key, value, dropout_p, is_causal,
                              return_debug_mask, scale=scale)
        try:
            planned = _calls._planned_forward(query, key, value, scale_value, mask, "bhsd", 0.0,
                                              _checks._NO_WINDOW, 0, True)
        except _lib.FlashgenError as failure:
            error = str(failure)
    if planned is None and error is None:  # inputs the kernels cannot read in place: the full path copies them
        with torch.cuda.device(query.device):
            call = _calls._ForwardCall(query, key, value, scale_value, mask, "bhsd", out_like_q=True)
            error = _library_call("flashgen_attention_forward",
                                  (*call.arguments(), _calls._stream(query.device)))
            planned = call.out, call.lse
    if error is not None:
        _State.last_error = error
        return _fall_back("forward", "library error", _FORWARD_OP, query, key, value, dropout_p, is_causal,
                          return_debug_mask, scale=scale)
    _count("forward", "flashgen")
    out, lse = planned
    return (out, lse, None, None, query.shape[2], key.shape[2], *_unused_outputs(query))


def _unused_outputs(query):
    """The forward ops' last three outputs (philox seed, philox offset, debug mask): with no dropout never read,
    allocated in the shapes and dtypes torch's meta kernels promise."""
    device = query.device
    return (torch.empty((2,), dtype=torch.uint64, device=device), torch.empty((), dtype=torch.uint64, device=device),
            torch.empty((0,), dtype=query.dtype, device=device))


def _backward_kernel(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
                     is_causal, philox_seed, philox_offset, *, scale=None):
    """aten::_scaled_dot_product_flash_attention_backward on CUDA: (dq, dk, dv) like query, key and value, from the
    forward's out and logsumexp (flashgen's or torch's: both are the natural-log LSE [batch, heads_q, seqlen_q])."""
    reason = _unservable(query, key, value, dropout_p)
    if reason is None and (logsumexp.dtype != torch.float32 or tuple(logsumexp.shape) != tuple(query.shape[:3])):
        reason = "logsumexp"
    arguments = (grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
                 is_causal, philox_seed, philox_offset)
    if reason is not None:
        return _fall_back("backward", reason, _BACKWARD_OP, *arguments, scale=scale)
    mask = "top_left" if is_causal else "none"
    device = query.device
    with torch.cuda.device(device):
        call = _calls._BackwardCall(grad_out, query, key, value, out, logsumexp,
                                    0.0 if scale is None else float(scale), mask, "bhsd",
                                    torch.are_deterministic_algorithms_enabled(), grads_like_inputs=True)
        stream = _calls._stream(device)
        workspace_bytes = ctypes.c_size_t(0)
        error = _library_call("flashgen_attention_backward_workspace_size",
                              (*call.arguments(), stream, ctypes.byref(workspace_bytes)))
        if error is None:
            workspace = torch.empty(workspace_bytes.value, dtype=torch.uint8, device=device)
            error = _library_call("flashgen_attention_backward_with_workspace",
                                  (*call.arguments(), ctypes.c_void_p(workspace.data_ptr()), workspace_bytes.value,
                                   stream))
    if error is not None:
        _State.last_error = error
        return _fall_back("backward", "library error", _BACKWARD_OP, *arguments, scale=scale)
    _count("backward", "flashgen")
    return call.dq, call.dk, call.dv


def _flash_mask(is_causal, window_size_left, window_size_right):
    """(mask, window) of aten::_flash_attention_forward's arguments (FlashAttention-2's: causal aligned bottom-right,
    a window (left, right) with None or -1 for no bound on a side, causal making the right side 0)."""
    window = (-1 if window_size_left is None else int(window_size_left),
              -1 if window_size_right is None else int(window_size_right))
    return _checks._mask_and_window(bool(is_causal), "bottom_right", window)


def _flash_unservable(query, key, value, cum_seq_q, dropout_p, lse=None):
    """_unservable for aten::_flash_attention_forward/backward: [batch, seqlen, heads, head_dim] tensors, or packed
    [total, heads, head_dim] ones with int32 offsets cum_seq_q; lse (the backward's) [batch, heads, seqlen_q] or
    [heads, total_q]."""
    if dropout_p != 0.0:
        return "dropout"
    packed = cum_seq_q is not None
    if query.dim() != (3 if packed else 4) or key.dim() != query.dim() or value.dim() != query.dim():
        return "layout"
    if packed and cum_seq_q.dtype != torch.int32:
        return "offsets"
    as_bhsd = [t.unsqueeze(0).transpose(1, 2) if packed else t.transpose(1, 2) for t in (query, key, value)]
    reason = _unservable(*as_bhsd, 0.0)
    if reason is None and lse is not None:
        expected = (query.shape[1], query.shape[0]) if packed else (query.shape[0], query.shape[2], query.shape[1])
        if lse.dtype != torch.float32 or tuple(lse.shape) != expected:
            reason = "logsumexp"
    return reason


def _flash_forward_kernel(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
                          return_debug_mask, *, scale=None, window_size_left=None, window_size_right=None,
                          seqused_k=None, alibi_slopes=None):
    """aten::_flash_attention_forward on CUDA (torch's varlen_attn and nested-tensor SDPA call it): q, k, v
    [batch, seqlen, heads, head_dim], or packed [total, heads, head_dim] with cum_seq_q/k; returns (out like query,
    lse [batch, heads_q, seqlen_q] or [heads_q, total_q], rng state, unused, debug mask) as torch's kernel does."""
    arguments = (query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, return_debug_mask)
    keywords = dict(scale=scale, window_size_left=window_size_left, window_size_right=window_size_right,
                    seqused_k=seqused_k, alibi_slopes=alibi_slopes)
    if _inside_fallback():
        return _fall_back("forward", "", "_flash_attention_forward", *arguments, **keywords)
    reason = ("debug mask" if return_debug_mask else "alibi" if alibi_slopes is not None  # the backward gets none
              else "seqused_k" if seqused_k is not None else _flash_unservable(query, key, value, cum_seq_q, dropout_p))
    if reason is not None:
        return _fall_back("forward", reason, "_flash_attention_forward", *arguments, **keywords)
    mask, window = _flash_mask(is_causal, window_size_left, window_size_right)
    scale_value = 0.0 if scale is None else float(scale)
    try:
        if cum_seq_q is not None:
            out, lse = _calls._varlen_forward(query, key, value, cum_seq_q, cum_seq_k, None, int(max_q),
                                              int(max_k), scale_value, mask, window=window)
        else:
            out, lse = _calls._forward(query, key, value, scale_value, mask, "bshd", checked=True,
                                       window=window)
    except _lib.FlashgenError as failure:
        _State.last_error = str(failure)
        return _fall_back("forward", "library error", "_flash_attention_forward", *arguments, **keywords)
    if out.stride() != query.stride():  # torch's kernel returns out laid out as query (empty_like)
        out = torch.empty_like(query).copy_(out)
    _count("forward", "flashgen")
    return (out, lse, *_unused_outputs(query))


def _flash_backward_kernel(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
                           is_causal, rng_state, unused, *, scale=None, window_size_left=None, window_size_right=None):
    """aten::_flash_attention_backward on CUDA: (dq, dk, dv) like query, key and value."""
    arguments = (grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
                 rng_state, unused)
    keywords = dict(scale=scale, window_size_left=window_size_left, window_size_right=window_size_right)
    if _inside_fallback():
        return _fall_back("backward", "", "_flash_attention_backward", *arguments, **keywords)
    reason = _flash_unservable(query, key, value, cum_seq_q, dropout_p, logsumexp)
    if reason is not None:
        return _fall_back("backward", reason, "_flash_attention_backward", *arguments, **keywords)
    mask, window = _flash_mask(is_causal, window_size_left, window_size_right)
    scale_value = 0.0 if scale is None else float(scale)
    deterministic = torch.are_deterministic_algorithms_enabled()
    try:
        if cum_seq_q is not None:
            dq, dk, dv, _ = _calls._varlen_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q,
                                                    cum_seq_k, int(max_q), int(max_k), scale_value, mask,
                                                    deterministic, window=window)
        else:
            dq, dk, dv, _ = _calls._backward_kernels(grad_out, query, key, value, out, logsumexp, scale_value,
                                                     mask, "bshd", deterministic, window=window)
    except _lib.FlashgenError as failure:
        _State.last_error = str(failure)
        return _fall_back("backward", "library error", "_flash_attention_backward", *arguments, **keywords)
    _count("backward", "flashgen")
    grads = []
    for grad, like in ((dq, query), (dk, key), (dv, value)):
        grads.append(grad if grad.stride() == like.stride() else torch.empty_like(like).copy_(grad))
    return tuple(grads)


def _native_sdpa():
    """The release library with its SDPA functions' signatures set (python/csrc/release/sdpa.cpp), or None."""
    native = _native.release_library()
    if native is not None and native.flashgen_torch_sdpa_counts.restype is not ctypes.c_char_p:
        native.flashgen_torch_sdpa_override.argtypes = (ctypes.c_int, ctypes.c_uint64)
        for name in ("flashgen_torch_sdpa_message", "flashgen_torch_sdpa_counts", "flashgen_torch_sdpa_last_error"):
            getattr(native, name).restype = ctypes.c_char_p
        native.flashgen_torch_sdpa_counts.argtypes = native.flashgen_torch_sdpa_last_error.argtypes = (ctypes.c_int,)
    return native


def _sm80_devices():
    """Bit d set where CUDA device d is sm_80 or newer (the release library's overrides serve those)."""
    return sum(1 << d for d in range(min(torch.cuda.device_count(), 64))
               if torch.cuda.get_device_capability(d) >= (8, 0))


class _Registration:
    """The overrides while they are registered; remove() unregisters them (torch.nn.attention's handle protocol).
    SDPA's pair runs as the release library's C++ kernels where it is loaded, else as the Python kernels above; the
    FlashAttention-2 pair below it always as the Python ones."""

    def __init__(self):
        library = torch.library.Library("aten", "IMPL")  # noqa: TOR901 (an override of aten's CUDA kernels)
        self.native = _native_sdpa()
        if self.native is not None:
            if self.native.flashgen_torch_sdpa_override(1, _sm80_devices()) != 0:
                raise _lib.FlashgenError("flashgen.torch.enable(): "
                                         + self.native.flashgen_torch_sdpa_message().decode(), _lib.ERROR_INTERNAL)
        else:
            library.impl(_FORWARD_OP, _forward_kernel, "CUDA")
            library.impl(_BACKWARD_OP, _backward_kernel, "CUDA")
        library.impl("_flash_attention_forward", _flash_forward_kernel, "CUDA")
        library.impl("_flash_attention_backward", _flash_backward_kernel, "CUDA")
        self.library = library

    def remove(self):
        if self.library is not None:
            self.library._destroy()
            self.library = None
        if self.native is not None:
            self.native.flashgen_torch_sdpa_override(0, 0)
            self.native = None


def _capture_originals():
    """torch's own CUDA kernels of the two ops, taken before any override (torch.library.get_kernel, torch >= 2.9),
    so that a fallback runs them rather than the dispatcher's current kernel (flashgen's: endless recursion)."""
    if _State.originals is not None:
        return
    if not hasattr(torch.library, "get_kernel"):
        raise _lib.FlashgenError(
            f"flashgen.torch.enable() needs torch >= 2.9 (torch.library.get_kernel, to fall back to torch's own "
            f"kernels); this is torch {torch.__version__}. flashgen.torch.attention works without it.",
            _lib.ERROR_UNSUPPORTED)
    _State.originals = {op: torch.library.get_kernel(f"aten::{op}", "CUDA") for op in _OPS}
    _State.cuda_keys = torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)


def _registry():
    """torch.nn.attention's flash-attention registry (register/activate/restore/current), or None (torch < 2.10)."""
    attention = torch.nn.attention
    names = ("register_flash_attention_impl", "activate_flash_attention_impl", "restore_flash_attention_impl",
             "current_flash_attention_impl", "list_flash_attention_impls")
    if not all(hasattr(attention, name) for name in names):
        return None
    return attention


def _flash_first():
    """Puts SDPA's flash backend first in its priority order, keeping the order before (None where this torch has
    no priority order). torch sets its default order at its first backend choice (cuDNN first on Hopper and
    Blackwell with a recent cuDNN), overwriting an order set before: one choice on a tiny probe (no kernel runs)
    makes that happen first."""
    get_order = getattr(torch._C, "_get_sdp_priority_order", None)
    set_order = getattr(torch._C, "_set_sdp_priority_order", None)
    if get_order is None or set_order is None:
        return None
    if torch.cuda.is_available() and hasattr(torch, "_fused_sdp_choice"):
        probe = torch.empty((1, 1, 8, 64), dtype=torch.float16, device="cuda")
        torch._fused_sdp_choice(probe, probe, probe)
    before = [int(backend) for backend in get_order()]
    flash = int(torch.nn.attention.SDPBackend.FLASH_ATTENTION)
    set_order([flash] + [backend for backend in before if backend != flash])
    return before


def is_enabled():
    """Whether SDPA's flash-attention ops run flashgen now."""
    if _State.through_registry:
        registry = _registry()
        return registry is not None and registry.current_flash_attention_impl() == IMPLEMENTATION_NAME
    return _State.library is not None


class _Enabled:
    """What enable() returns: also a context manager that turns flashgen off again on exit if this enable() turned
    it on."""

    def __init__(self, turned_on):
        self.turned_on = turned_on

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.turned_on:
            disable()
        return False


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
    with _State.lock:
        if is_enabled():
            return _Enabled(False)
        _capture_originals()
        registry = _registry()
        if registry is not None:
            if IMPLEMENTATION_NAME not in registry.list_flash_attention_impls():
                registry.register_flash_attention_impl(IMPLEMENTATION_NAME, register_fn=_Registration)
            registry.activate_flash_attention_impl(IMPLEMENTATION_NAME)
            _State.through_registry = True
        else:
            _State.library = _Registration()
            _State.through_registry = False
        _State.saved_priority = _flash_first()
        return _Enabled(True)


def disable():
    """Undoes enable(): scaled_dot_product_attention runs torch's kernels and SDPA's backend order is as before."""
    with _State.lock:
        if _State.through_registry:
            registry = _registry()
            if registry.current_flash_attention_impl() == IMPLEMENTATION_NAME:
                registry.restore_flash_attention_impl()
            _State.through_registry = False
        elif _State.library is not None:
            _State.library.remove()
            _State.library = None
        if _State.saved_priority is not None:
            torch._C._set_sdp_priority_order(_State.saved_priority)
            _State.saved_priority = None


def sdpa_stats():
    """What scaled_dot_product_attention's flash-attention calls ran since the process started (or
    reset_sdpa_stats()): {"enabled": bool, "forward": {"flashgen": n, "fallback: <reason>": n, ...}, "backward": {...},
    "last_error": the library's message of the last call that fell back on an error, or None}. A CUDA graph's
    replays are not calls: only its capture counts."""
    native = _native_sdpa()
    with _State.lock:
        counts = {direction: collections.Counter(counter) for direction, counter in _State.counts.items()}
        last_error = _State.last_error
        if native is not None:  # what the C++ overrides counted
            for line in native.flashgen_torch_sdpa_counts(0).decode().splitlines():
                direction, outcome, calls = line.split("\t")
                counts[direction][outcome] += int(calls)
            last_error = native.flashgen_torch_sdpa_last_error(0).decode() or last_error
        return {
            "enabled": is_enabled(),
            "forward": dict(counts["forward"]),
            "backward": dict(counts["backward"]),
            "last_error": last_error,
        }


def reset_sdpa_stats():
    """Sets sdpa_stats()'s counts to zero."""
    native = _native_sdpa()
    with _State.lock:
        for counter in _State.counts.values():
            counter.clear()
        _State.last_error = None
        if native is not None:
            native.flashgen_torch_sdpa_counts(1)
            native.flashgen_torch_sdpa_last_error(1)
