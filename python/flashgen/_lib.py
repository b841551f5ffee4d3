"""Finds and loads libflashgen.so with ctypes and declares its C ABI (include/flashgen/flashgen.h, mirrored
here by hand: keep the two in step). No torch here; flashgen.torch builds its calls on these declarations.
"""

import ctypes
import json
import os
import pathlib
import threading

# flashgen_dtype, flashgen_mask: C enums, int-sized on every ABI flashgen targets.
FLOAT16 = 0
BFLOAT16 = 1
FLOAT8_E4M3 = 2           # e4m3fn (torch.float8_e4m3fn): the forward's q, k, v and a KV cache's k_cache, v_cache
FLOAT8_E5M2 = 3           # e5m2 (torch.float8_e5m2): likewise
MASK_NONE = 0
MASK_CAUSAL = 1           # bottom-right aligned: key j visible to query i iff j <= i + seqlen_k - seqlen_q
MASK_CAUSAL_TOP_LEFT = 2  # top-left aligned: key j visible to query i iff j <= i
MASK_SLIDING_WINDOW = 3   # query i sees keys i + seqlen_k - seqlen_q - window_left ... + window_right (-1: unbounded)

# Status codes of every call.
SUCCESS = 0
ERROR_INVALID_ARGUMENT = 1
ERROR_UNSUPPORTED = 2
ERROR_NO_DEVICE = 3
ERROR_COMPILE = 4
ERROR_CUDA = 5
ERROR_INTERNAL = 6
STATUS_NAMES = {
    SUCCESS: "success",
    ERROR_INVALID_ARGUMENT: "invalid argument",
    ERROR_UNSUPPORTED: "unsupported",
    ERROR_NO_DEVICE: "no device",
    ERROR_COMPILE: "compile error",
    ERROR_CUDA: "CUDA error",
    ERROR_INTERNAL: "internal error",
}


class Tensor(ctypes.Structure):
    """flashgen_tensor: a [batch, seqlen, heads, head_dim] view of device memory."""
    _fields_ = [
        ("data", ctypes.c_void_p),      # device pointer, 16-byte aligned
        ("dtype", ctypes.c_int),        # FLOAT16 or BFLOAT16 (FP8 where flashgen.h takes it: FLOAT8_E4M3, _E5M2)
        ("shape", ctypes.c_int64 * 4),  # [batch, seqlen, heads, head_dim]
        ("stride", ctypes.c_int64 * 4),  # elements; stride[3] == 1, the others multiples of 16 bytes
    ]


class AttentionOptions(ctypes.Structure):
    """flashgen_attention_options; size is set to this struct's size (positional arguments start at softmax_scale)."""
    _fields_ = [
        ("size", ctypes.c_size_t),          # sizeof(flashgen_attention_options): the library refuses another
        ("softmax_scale", ctypes.c_float),  # <= 0: 1/sqrt(head_dim)
        ("mask", ctypes.c_int),             # MASK_*
        ("deterministic", ctypes.c_int),    # backward: nonzero gives bitwise-identical gradients
        ("softcap", ctypes.c_float),        # > 0: scores s become softcap * tanh(s / softcap); 0: none
        ("window_left", ctypes.c_int32),    # MASK_SLIDING_WINDOW: keys before the diagonal, -1: unbounded
        ("window_right", ctypes.c_int32),   # and after it
        ("alibi_slopes", ctypes.c_void_p),  # NULL, or fp32 device [heads_q] / [batch, heads_q] ALiBi slopes
        ("alibi_batch_stride", ctypes.c_int64),  # elements between sequences' slopes; 0: one [heads_q] array
        ("sinks", ctypes.c_void_p),         # NULL, or fp32 device [heads_q] attention-sink logits
        ("dsinks", ctypes.c_void_p),        # backward: NULL, or fp32 device [heads_q] for the sinks' gradient
        ("attention_chunk", ctypes.c_int32),  # > 0: keys of the row's own chunk of that many positions only
        ("variant", ctypes.c_void_p),       # NULL, or a flashgen_variant* (flashgen_variant_create)
        ("variant_buffers", ctypes.c_void_p),  # host array of the variant's buffers' device pointers
        ("variant_scalars", ctypes.c_void_p),  # host array of its scalars' 4-byte values
        ("block_mask", ctypes.c_void_p),    # NULL, or a flashgen_block_mask* (flashgen_block_mask_create)
        ("q_descale", ctypes.c_void_p),     # FP8 forward: NULL, or fp32 device descales read at (batch, kv head)
        ("k_descale", ctypes.c_void_p),
        ("v_descale", ctypes.c_void_p),
        ("q_descale_stride", ctypes.c_int64 * 2),  # elements; {0, 0}: one value
        ("k_descale_stride", ctypes.c_int64 * 2),
        ("v_descale_stride", ctypes.c_int64 * 2),
    ]

    def __init__(self, *args, **kwargs):
        super().__init__(ctypes.sizeof(AttentionOptions), *args, **kwargs)


# flashgen_arg_type: the type of a user variant's buffer or scalar.
ARG_FLOAT32, ARG_INT32, ARG_INT64, ARG_UINT8 = 0, 1, 2, 3


class VariantArg(ctypes.Structure):
    """flashgen_variant_arg: a user variant's buffer or scalar, by name and type."""
    _fields_ = [("name", ctypes.c_char_p), ("type", ctypes.c_int)]


class VariantDesc(ctypes.Structure):
    """flashgen_variant_desc: a user variant's function bodies and the buffers and scalars they read."""
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("mask_mod", ctypes.c_char_p),
        ("score_mod", ctypes.c_char_p),
        ("score_grad", ctypes.c_char_p),
        ("score_bias", ctypes.c_char_p),
        ("helpers", ctypes.c_char_p),
        ("buffers", ctypes.POINTER(VariantArg)),
        ("num_buffers", ctypes.c_int32),
        ("scalars", ctypes.POINTER(VariantArg)),
        ("num_scalars", ctypes.c_int32),
        ("mask_same_for_heads", ctypes.c_int32),
    ]


class ForwardProblem(ctypes.Structure):
    """flashgen_forward_problem: a forward problem by its sizes, for flashgen_tune_forward."""
    _fields_ = [
        ("dtype", ctypes.c_int),
        ("mask", ctypes.c_int),
        ("batch", ctypes.c_int64),
        ("seqlen_q", ctypes.c_int64),
        ("seqlen_k", ctypes.c_int64),
        ("heads_q", ctypes.c_int64),
        ("heads_kv", ctypes.c_int64),
        ("head_dim", ctypes.c_int64),
    ]


class VarlenForwardArgs(ctypes.Structure):
    """flashgen_varlen_forward_args: a packed batch of sequences, for flashgen_attention_varlen_forward."""
    _fields_ = [
        ("size", ctypes.c_size_t),          # ctypes.sizeof(VarlenForwardArgs)
        ("q", Tensor),                      # [1, total_q, heads_q, head_dim]
        ("k", Tensor),                      # [1, total_k, heads_kv, head_dim]
        ("v", Tensor),
        ("out", Tensor),
        ("lse", ctypes.c_void_p),           # fp32 [heads_q, total_q] or NULL
        ("cu_seqlens_q", ctypes.c_void_p),  # device int32 [batch + 1]
        ("cu_seqlens_k", ctypes.c_void_p),
        ("seqused_k", ctypes.c_void_p),     # device int32 [batch] or NULL
        ("batch", ctypes.c_int64),
        ("max_seqlen_q", ctypes.c_int64),
        ("max_seqlen_k", ctypes.c_int64),
        ("options", AttentionOptions),
        ("block_table", ctypes.c_void_p),   # device int32 [batch, max_pages] (k, v paged) or NULL
        ("max_pages", ctypes.c_int64),
    ]


class VarlenBackwardArgs(ctypes.Structure):
    """flashgen_varlen_backward_args: the varlen forward's batch, its out and lse, dout and the gradients."""
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("q", Tensor), ("k", Tensor), ("v", Tensor), ("out", Tensor), ("dout", Tensor),
        ("dq", Tensor), ("dk", Tensor), ("dv", Tensor),
        ("lse", ctypes.c_void_p),           # fp32 [heads_q, total_q]
        ("cu_seqlens_q", ctypes.c_void_p),
        ("cu_seqlens_k", ctypes.c_void_p),
        ("batch", ctypes.c_int64),
        ("max_seqlen_q", ctypes.c_int64),
        ("max_seqlen_k", ctypes.c_int64),
        ("options", AttentionOptions),
    ]


class KvCacheArgs(ctypes.Structure):
    """flashgen_kvcache_args: new queries against a KV cache (contiguous or paged), for flashgen_attention_kvcache."""
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("q", Tensor),                       # [batch, seqlen_q, heads_q, head_dim]
        ("k_cache", Tensor),                 # [batch, capacity, heads_kv, head_dim] or [num_pages, page_size, ...]
        ("v_cache", Tensor),
        ("k_new", Tensor),                   # [batch, seqlen_new, heads_kv, head_dim], data NULL for none
        ("v_new", Tensor),
        ("out", Tensor),
        ("lse", ctypes.c_void_p),            # fp32 [batch, heads_q, seqlen_q] or NULL
        ("cache_seqlens", ctypes.c_void_p),  # device int32 [batch] or NULL
        ("block_table", ctypes.c_void_p),    # device int32 [batch, max_pages] or NULL
        ("max_pages", ctypes.c_int64),
        ("num_splits", ctypes.c_int64),      # 0: chosen
        ("workspace", ctypes.c_void_p),      # NULL: flashgen's pool
        ("workspace_bytes", ctypes.c_size_t),
        ("options", AttentionOptions),
        ("k_scale", ctypes.c_void_p),        # FP8 cache: fp32 device key scales, or NULL (1); NULL for a 16-bit cache
        ("k_scale_stride", ctypes.c_int64 * 2),  # sequence b, kv head h: k_scale[b * [0] + h * [1]]; 0: shared
        ("v_scale", ctypes.c_void_p),        # the values' likewise
        ("v_scale_stride", ctypes.c_int64 * 2),
    ]


class FlashgenError(RuntimeError):
    """A flashgen call failed. str(error) is the library's message; .status is its status code (STATUS_NAMES)."""

    def __init__(self, message, status=ERROR_INTERNAL):
        super().__init__(message)
        self.status = status


class FlashgenArgumentError(FlashgenError, ValueError):
    """A bad argument (status 1) or a valid request flashgen cannot serve (status 2, e.g. head_dim 100)."""


def error_for(status, message):
    """The exception for a failed call's status and message."""
    kind = FlashgenArgumentError if status in (ERROR_INVALID_ARGUMENT, ERROR_UNSUPPORTED) else FlashgenError
    return kind(message, status)


_tensor_p = ctypes.POINTER(Tensor)
_options_p = ctypes.POINTER(AttentionOptions)
_size_p = ctypes.POINTER(ctypes.c_size_t)
_void_p = ctypes.c_void_p
_json_out = [ctypes.c_char_p, ctypes.c_size_t, _size_p]  # json, json_capacity, json_length

# name: (restype, argtypes), as flashgen.h declares them.
_SIGNATURES = {
    "flashgen_attention_forward": (ctypes.c_int, [_tensor_p] * 4 + [_void_p, _options_p, _void_p]),
    "flashgen_attention_varlen_forward": (ctypes.c_int, [ctypes.POINTER(VarlenForwardArgs), _void_p]),
    "flashgen_attention_varlen_backward": (ctypes.c_int, [ctypes.POINTER(VarlenBackwardArgs), _void_p]),
    "flashgen_attention_kvcache": (ctypes.c_int, [ctypes.POINTER(KvCacheArgs), _void_p]),
    "flashgen_attention_kvcache_workspace_size": (ctypes.c_int, [ctypes.POINTER(KvCacheArgs), _void_p, _size_p]),
    "flashgen_attention_backward": (ctypes.c_int, [_tensor_p] * 5 + [_void_p] + [_tensor_p] * 3 + [_options_p, _void_p]),
    "flashgen_attention_backward_workspace_size": (
        ctypes.c_int, [_tensor_p] * 5 + [_void_p] + [_tensor_p] * 3 + [_options_p, _void_p, _size_p]),
    "flashgen_attention_backward_with_workspace": (
        ctypes.c_int, [_tensor_p] * 5 + [_void_p] + [_tensor_p] * 3 + [_options_p, _void_p, ctypes.c_size_t, _void_p]),
    "flashgen_explain_forward": (ctypes.c_int, [_tensor_p] * 4 + [_void_p, _options_p, _void_p] + _json_out),
    "flashgen_explain_backward": (
        ctypes.c_int, [_tensor_p] * 5 + [_void_p] + [_tensor_p] * 3 + [_options_p, _void_p] + _json_out),
    "flashgen_tune_forward": (ctypes.c_int, [ctypes.POINTER(ForwardProblem), _void_p] + _json_out),
    "flashgen_set_tune_on_first_use": (None, [ctypes.c_int]),
    "flashgen_release_cached_memory": (ctypes.c_int, []),
    "flashgen_variant_create": (ctypes.c_int, [ctypes.POINTER(VariantDesc), ctypes.POINTER(ctypes.c_void_p)]),
    "flashgen_variant_destroy": (None, [_void_p]),
    "flashgen_variant_tag": (ctypes.c_char_p, [_void_p]),
    "flashgen_block_mask_create": (ctypes.c_int, [ctypes.POINTER(ctypes.c_void_p)]),
    "flashgen_block_mask_destroy": (None, [_void_p]),
    "flashgen_last_error": (ctypes.c_char_p, []),
    "flashgen_version": (ctypes.c_char_p, []),
}

LIBRARY_NAME = "libflashgen.so"
_PACKAGE_DIR = pathlib.Path(__file__).resolve().parent


def library_candidates():
    """Where load_library looks, in order, as (description, path or None for the system loader):
    $FLASHGEN_LIBRARY when set (then nothing else), the copy bundled next to this package, build/libflashgen.so
    of the source tree when this package runs from python/ of a flashgen checkout, the system loader."""
    explicit = os.environ.get("FLASHGEN_LIBRARY")
    if explicit:
        # Absolute: a bare file name would otherwise go to the system loader's search, which skips the
        # current directory, and a relative path would be wrong after a chdir.
        return [("FLASHGEN_LIBRARY", os.path.abspath(explicit))]
    bundled = sorted((_PACKAGE_DIR / "lib").glob(LIBRARY_NAME + ".*"))  # the wheel's, under its SONAME
    candidates = [("bundled with the package", str(bundled[0] if bundled else _PACKAGE_DIR / "lib" / LIBRARY_NAME))]
    checkout = _PACKAGE_DIR.parent.parent
    if (checkout / "include" / "flashgen" / "flashgen.h").is_file():
        candidates.append(("the source tree's build", str(checkout / "build" / LIBRARY_NAME)))
    candidates.append(("the system loader (LD_LIBRARY_PATH, ldconfig)", None))
    return candidates


class _Loaded:
    lock = threading.Lock()
    library = None
    path = None


def _declare(library):
    for name, (restype, argtypes) in _SIGNATURES.items():
        function = getattr(library, name, None)
        if function is None:
            continue  # an older library: function() names what is missing when it is needed
        function.restype = restype
        function.argtypes = argtypes


def load_library():
    """The loaded library (once per process), or FlashgenError listing every place tried and why it failed."""
    with _Loaded.lock:
        if _Loaded.library is not None:
            return _Loaded.library
        tried = []
        for description, path in library_candidates():
            if path is not None and not os.path.exists(path):
                tried.append(f"{path} ({description}): no such file")
                continue
            try:
                library = ctypes.CDLL(path if path is not None else LIBRARY_NAME)
            except OSError as error:
                if path is not None:
                    # The file is there but does not load (a missing libnvrtc, a wrong architecture): that is
                    # the answer, not a reason to try an older copy elsewhere.
                    raise FlashgenError(f"flashgen: cannot load {path} ({description}): {error}") from error
                tried.append(f"{LIBRARY_NAME} through {description}: {error}")
                continue
            if getattr(library, "flashgen_version", None) is None:
                raise FlashgenError(f"flashgen: {path or LIBRARY_NAME} ({description}) loads but is not libflashgen "
                                    "(it has no flashgen_version)")
            _declare(library)
            _Loaded.library = library
            _Loaded.path = path if path is not None else _loaded_path(library)
            return library
        raise FlashgenError(
            "flashgen: libflashgen.so not found; looked for " + "; ".join(tried) +
            ". Build it (cmake -S . -B build && cmake --build build) or set FLASHGEN_LIBRARY to its path.")


def _loaded_path(library):
    """The file the system loader picked, from /proc/self/maps (Linux), else the name asked for."""
    try:
        handle_symbol = ctypes.cast(library.flashgen_version, ctypes.c_void_p).value
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split()
                if len(fields) < 6:
                    continue
                start, end = (int(x, 16) for x in fields[0].split("-"))
                if start <= handle_symbol < end:
                    return fields[5]
    except (OSError, ValueError, AttributeError):
        pass
    return LIBRARY_NAME


def library_path():
    """Path of the loaded library (loading it if needed)."""
    load_library()
    return _Loaded.path


def function(name):
    """One C ABI function of the loaded library, or FlashgenError when this library predates it."""
    assert name in _SIGNATURES, f"{name} is not declared in _SIGNATURES"
    found = getattr(load_library(), name, None)
    if found is None:
        raise FlashgenError(f"flashgen: {_Loaded.path} (version {version()}) has no {name}; rebuild the library")
    return found


def last_error():
    """The calling thread's last failure message from the library."""
    message = function("flashgen_last_error")()
    return message.decode(errors="replace") if message else ""


def check(status, call):
    """Raises the error of a failed call (status != 0) with the library's message."""
    if status != SUCCESS:
        raise error_for(status, f"{call}: {last_error()} [{STATUS_NAMES.get(status, status)}]")


def call_json(name, *args):
    """Calls a C ABI function that answers with JSON in a caller buffer (json, json_capacity, json_length
    last), growing the buffer when the answer does not fit; returns the parsed answer."""
    call = function(name)
    capacity = 1 << 14
    while True:
        buffer = ctypes.create_string_buffer(capacity)
        length = ctypes.c_size_t(0)
        status = call(*args, buffer, capacity, ctypes.pointer(length))
        if status == ERROR_INVALID_ARGUMENT and length.value >= capacity:
            capacity = length.value + 1
            continue
        check(status, name)
        return json.loads(buffer.value[:length.value].decode())


def version():
    """The library's version, e.g. "0.1.0"."""
    return function("flashgen_version")().decode()


def release_cached_memory():
    """Gives the device memory flashgen's own pools keep between calls back to the driver, on every device: the
    workspaces of calls that take none from torch (the packed backward, KV-cache calls without one). Memory of calls
    still queued stays theirs; the next such call maps its workspace again."""
    check(function("flashgen_release_cached_memory")(), "flashgen_release_cached_memory")


def set_tune_on_first_use(enabled):
    """Tune-on-first-use for this process (FLASHGEN_TUNE=1 turns it on from the environment): a forward or
    backward call whose problem size bucket the user's tuning database lacks for this GPU first sweeps 16 candidates (seconds,
    never while a CUDA graph is being captured), stores the winner and runs it. A dense call with mask_mod=,
    score_mod= or score_bias= is tuned as a problem of its own, its functions checked with the call's own variant tensors."""
    function("flashgen_set_tune_on_first_use")(1 if enabled else 0)
