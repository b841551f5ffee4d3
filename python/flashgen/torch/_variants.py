"""User-defined variants for flashgen.torch: the caller's mask_mod, score_mod (and score_grad) or score_bias as C++
function bodies, compiled into the kernels (flashgen_variant_create), with the tensors and numbers they read.

A call names the bodies and a dict of arguments; each distinct description is created once per process (its handle
kept for the process's life, as compiled kernels are) and each call passes its tensors' pointers and its numbers'
bits in the options."""

import ast
import ctypes
import functools
import struct
import threading

import torch

from .. import _lib
from .._lib import FlashgenArgumentError

# A buffer's element type from its tensor's dtype; a scalar's from its Python type.
_BUFFER_TYPES = {torch.float32: _lib.ARG_FLOAT32, torch.int32: _lib.ARG_INT32, torch.int64: _lib.ARG_INT64,
                 torch.uint8: _lib.ARG_UINT8, torch.bool: _lib.ARG_UINT8}


def _bad(message):
    raise FlashgenArgumentError(message, _lib.ERROR_INVALID_ARGUMENT)


class _Handles:
    lock = threading.Lock()
    by_description = {}


def _handle(description):
    """The flashgen_variant* of a description (bodies, then the buffers' and scalars' (name, type) pairs)."""
    with _Handles.lock:
        handle = _Handles.by_description.get(description)
        if handle is not None:
            return handle
        mask_mod, score_mod, score_grad, score_bias, helpers, buffers, scalars, same_for_heads = description
        desc = _lib.VariantDesc()
        desc.size = ctypes.sizeof(desc)
        for field, body in (("mask_mod", mask_mod), ("score_mod", score_mod), ("score_grad", score_grad),
                            ("score_bias", score_bias), ("helpers", helpers)):
            setattr(desc, field, body.encode() if body is not None else None)
        arrays = []  # alive until the call returns
        for field, items in (("buffers", buffers), ("scalars", scalars)):
            array = (_lib.VariantArg * max(len(items), 1))(*((name.encode(), kind) for name, kind in items))
            arrays.append(array)
            setattr(desc, field, array if items else None)
            setattr(desc, "num_" + field, len(items))
        desc.mask_same_for_heads = 1 if same_for_heads else 0
        out = ctypes.c_void_p()
        _lib.check(_lib.function("flashgen_variant_create")(ctypes.byref(desc), ctypes.byref(out)),
                   "flashgen_variant_create")
        _Handles.by_description[description] = out.value
        return out.value


class BlockMask:
    """A user mask's block classes kept across calls (flashgen_block_mask), as FlexAttention's block mask is: calls
    that pass the same BlockMask with the same mask_mod and variant_args (a model's layers within one step) classify
    the mask's blocks once per shape and pass, the first call computing them into memory this object owns, the later
    ones reusing them. Calls are matched by shapes, tensor addresses and numbers, not by contents: the tensors in
    variant_args, and a packed call's cu_seqlens and seqused_k, must keep their contents while it is in use. Make a
    new one for each batch (a new tensor may reuse a freed one's address). Each distinct call keeps its own classes
    until the object is freed. The first call of each shape allocates (make it, and let it finish, before capturing
    a CUDA graph); its memory is freed with the object, after the device's queued work is done."""

    __slots__ = ("handle",)

    def __init__(self):
        handle = ctypes.c_void_p()
        _lib.check(_lib.function("flashgen_block_mask_create")(ctypes.byref(handle)), "flashgen_block_mask_create")
        self.handle = handle.value

    def __del__(self):
        handle, self.handle = getattr(self, "handle", None), None
        if handle and _lib is not None:  # (modules may be gone at interpreter exit)
            _lib.function("flashgen_block_mask_destroy")(handle)


class UserVariant:
    """One call's user variant: its handle, its buffers (tensors kept alive until the call is queued) and the host
    arrays the options point at."""

    __slots__ = ("handle", "buffers", "buffer_array", "scalar_array", "block_mask")

    def __init__(self, handle, buffers, scalar_bits, block_mask=None):
        self.handle = handle
        self.buffers = buffers
        self.buffer_array = (ctypes.c_void_p * max(len(buffers), 1))(*(t.data_ptr() for t in buffers))
        self.scalar_array = (ctypes.c_uint32 * max(len(scalar_bits), 1))(*scalar_bits)
        self.block_mask = block_mask  # a BlockMask, kept alive by the call

    def apply(self, options):
        """Points a flashgen_attention_options at this variant, its arguments and its block mask."""
        options.variant = self.handle
        options.variant_buffers = ctypes.cast(self.buffer_array, ctypes.c_void_p)
        options.variant_scalars = ctypes.cast(self.scalar_array, ctypes.c_void_p)
        options.block_mask = self.block_mask.handle if self.block_mask is not None else None


def no_variant(mask_mod, score_mod, score_grad, score_bias, helpers, variant_args, block_mask=None):
    """Whether a call names no user variant at all: the fast paths of warm calls take only those (any of these
    arguments given goes through the checks, which refuse a score_grad or variant_args without a function)."""
    return (mask_mod is None and score_mod is None and score_grad is None and score_bias is None and helpers is None
            and not variant_args and block_mask is None)


def _checked_arguments(device, mask_mod, score_mod, score_grad, score_bias, helpers, variant_args, block_mask):
    """(buffers, buffer_types, scalars, scalar_types) of a call's variant_args, checked, or None when it names no
    function: buffers the tensors as passed, scalars the Python numbers."""
    if block_mask is not None:
        if not isinstance(block_mask, BlockMask):
            _bad(f"block_mask must be a flashgen.torch.BlockMask, got {type(block_mask).__name__}")
        if mask_mod is None:
            _bad("block_mask comes with a mask_mod (it keeps the mask's block classes)")
    if mask_mod is None and score_mod is None and score_bias is None:
        if score_grad is not None or helpers is not None or variant_args:
            _bad("score_grad, helpers and variant_args come with a mask_mod, score_mod or score_bias")
        return None
    for name, body in (("mask_mod", mask_mod), ("score_mod", score_mod), ("score_grad", score_grad),
                       ("score_bias", score_bias), ("helpers", helpers)):
        if body is not None and not isinstance(body, str):
            _bad(f"{name} must be a string of C++ (a function body), got {type(body).__name__}")
    buffers, buffer_types, scalars, scalar_types = [], [], [], []
    for name, value in (variant_args or {}).items():
        if isinstance(value, torch.Tensor):
            if value.dtype not in _BUFFER_TYPES:
                _bad(f"variant_args[{name!r}] must be float32, int32, int64, uint8 or bool, got {value.dtype}")
            if value.device != device:
                _bad(f"variant_args[{name!r}] must be on {device} (q's device), got {value.device}")
            buffers.append(value)
            buffer_types.append((name, _BUFFER_TYPES[value.dtype]))
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            _bad(f"variant_args[{name!r}] must be a tensor, an int or a float, got {type(value).__name__}")
        else:
            if isinstance(value, int) and not -2**31 <= value < 2**31:
                _bad(f"variant_args[{name!r}] = {value} does not fit an int32 scalar")
            scalars.append(value)
            scalar_types.append((name, _lib.ARG_INT32 if isinstance(value, int) else _lib.ARG_FLOAT32))
    return buffers, buffer_types, scalars, scalar_types


def _bits(value, kind):
    """A scalar's 32 bits as the kernels read them: int32, or float32."""
    if kind == _lib.ARG_INT32:
        return int(value) & 0xffffffff
    return struct.unpack("<I", struct.pack("<f", value))[0]


def _readable_buffer(t):
    """A buffer as the kernels read it: contiguous, bool as uint8."""
    t = t.contiguous()
    return t.view(torch.uint8) if t.dtype == torch.bool else t


def user_variant(device, mask_mod=None, score_mod=None, score_grad=None, score_bias=None, helpers=None,
                 variant_args=None, mask_same_for_heads=False, block_mask=None):
    """The UserVariant of a call's arguments, or None when it names no function. variant_args: a dict from the names
    the bodies use to tensors on device (buffers: float32, int32, int64, uint8 or bool, read as const float*, int*,
    long long*, unsigned char*) or Python numbers (scalars: int as int32, float as float32). mask_same_for_heads: the
    mask ignores head, so the kernels classify its blocks once per batch entry. block_mask: a BlockMask keeping the
    classes across calls, or None."""
    checked = _checked_arguments(device, mask_mod, score_mod, score_grad, score_bias, helpers, variant_args,
                                 block_mask)
    if checked is None:
        return None
    buffers, buffer_types, scalars, scalar_types = checked
    description = (mask_mod, score_mod, score_grad, score_bias, helpers, tuple(buffer_types), tuple(scalar_types),
                   bool(mask_same_for_heads))
    return UserVariant(_handle(description), [_readable_buffer(t) for t in buffers],
                       [_bits(value, kind) for value, (_, kind) in zip(scalars, scalar_types)], block_mask)


def variant_op_arguments(device, mask_mod=None, score_mod=None, score_grad=None, score_bias=None, helpers=None,
                         variant_args=None, mask_same_for_heads=False, block_mask=None):
    """A call's user variant as the variant ops take it: (description, tensors, numbers), the description a text of
    the bodies and the arguments' names and types (a constant of a compiled graph), the tensors and numbers in its
    order; or None when the call names no function. The ops compile the description once per process, as
    user_variant does. A block_mask is checked and not used: the ops classify the mask's blocks at each call."""
    checked = _checked_arguments(device, mask_mod, score_mod, score_grad, score_bias, helpers, variant_args,
                                 block_mask)
    if checked is None:
        return None
    buffers, buffer_types, scalars, scalar_types = checked
    # repr of constants: torch.compile folds it into a constant of the graph (json.dumps would break the graph).
    description = repr((mask_mod, score_mod, score_grad, score_bias, helpers, tuple(buffer_types),
                        tuple(scalar_types), bool(mask_same_for_heads)))
    return description, buffers, [float(value) for value in scalars]


@functools.lru_cache(maxsize=1024)
def _parsed(description):
    """The description tuple (user_variant's) of variant_op_arguments' text."""
    return ast.literal_eval(description)


def from_op_arguments(description, tensors, numbers):
    """The UserVariant of a variant op's arguments (variant_op_arguments' description, tensors and numbers)."""
    parsed = _parsed(description)
    scalar_types = parsed[6]
    if len(tensors) != len(parsed[5]) or len(numbers) != len(scalar_types):
        _bad(f"the variant names {len(parsed[5])} tensors and {len(scalar_types)} numbers, the call passes "
             f"{len(tensors)} and {len(numbers)}")
    return UserVariant(_handle(parsed), [_readable_buffer(t) for t in tensors],
                       [_bits(value, kind) for value, (_, kind) in zip(numbers, scalar_types)])


def variant_tag(variant):
    """The tag kernel names carry ("u" and 12 hex digits)."""
    return _lib.function("flashgen_variant_tag")(variant.handle).decode()
