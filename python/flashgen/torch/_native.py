"""libflashgen_torch.so, flashgen's ops in C++ on torch's stable ABI (python/csrc/): found beside the loaded
libflashgen (or at $FLASHGEN_TORCH_OPS_LIBRARY) and loaded with torch.ops.load_library, which registers the ops with
torch's dispatcher. Without it (not built: torch's headers were missing when the wheel was built; a torch older than
2.10; FLASHGEN_NATIVE_OPS=0) _ops.py defines the same ops in Python over the C ABI through ctypes.
"""

import os

import torch

from .. import _lib

LIBRARY_NAME = "libflashgen_torch.so"


class _State:
    path = None    # the loaded op library, or None
    reason = None  # why it is not loaded


def library_path():
    """Where the op library is looked for: $FLASHGEN_TORCH_OPS_LIBRARY, else beside the loaded libflashgen (the wheel's
    flashgen/lib, a build folder), whose SONAME it links."""
    explicit = os.environ.get("FLASHGEN_TORCH_OPS_LIBRARY")
    if explicit:
        return os.path.abspath(explicit)
    return os.path.join(os.path.dirname(os.path.realpath(_lib.library_path())), LIBRARY_NAME)


def load():
    """Loads the op library once; returns its path, or None with the reason in _State.reason."""
    if _State.path is not None or _State.reason is not None:
        return _State.path
    if os.environ.get("FLASHGEN_NATIVE_OPS", "1") == "0":
        _State.reason = "FLASHGEN_NATIVE_OPS=0"
        return None
    try:
        path = library_path()  # loads libflashgen first: the op library binds to that copy by its SONAME
    except _lib.FlashgenError as error:
        _State.reason = f"libflashgen not loaded ({error})"
        return None
    if not os.path.exists(path):
        _State.reason = f"{path}: no such file (built when torch's headers are present at build time)"
        return None
    try:
        torch.ops.load_library(path)
    except (OSError, RuntimeError) as error:
        _State.reason = f"{path} does not load ({error}); it needs torch >= 2.10"
        return None
    _State.path = path
    return path


def loaded():
    """Whether the ops run in C++ (the op library is loaded)."""
    return _State.path is not None


_below_autograd = getattr(torch._C, "_AutoDispatchBelowAutograd", None)
_STATUS_NAMES = {name: status for status, name in _lib.STATUS_NAMES.items()}


def call(op, *args):
    """op(*args) of an eager call, straight to its CUDA kernel (the caller's autograd, if any, is its own), a failure
    of the library raised as flashgen._lib.check raises it: the kernels word their message "call: message [status]"."""
    try:
        if _below_autograd is None:
            return op(*args)
        with _below_autograd():
            return op(*args)
    except RuntimeError as error:
        message = str(error)
        for name, status in _STATUS_NAMES.items():
            if f"[{name}]" in message:
                raise _lib.error_for(status, message.splitlines()[0]) from None
        raise
