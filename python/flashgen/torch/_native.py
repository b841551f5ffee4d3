"""libflashgen_torch.so, flashgen's ops in C++ on torch's stable ABI (python/csrc/): found beside the loaded
libflashgen (or at $FLASHGEN_TORCH_OPS_LIBRARY) and loaded with torch.ops.load_library, which registers the ops with
torch's dispatcher. Without it (not built: torch's headers were missing when the wheel was built; a torch older than
2.10; FLASHGEN_NATIVE_OPS=0) _ops.py defines the same ops in Python over the C ABI through ctypes.

Beside it, libflashgen_torch-<release>.so registers the dense and packed forward ops' autograd in C++ and holds
enable()'s SDPA overrides (python/csrc/release/): built against one torch release's C++ API, it is loaded only by
that release (and not with FLASHGEN_RELEASE_LIBRARY=0); otherwise _ops.py registers the same formulas from Python
and _sdpa.py the overrides.
"""

import ctypes
import glob
import os
import re

import torch

from .. import _lib

LIBRARY_NAME = "libflashgen_torch.so"
RELEASE_LIBRARY_PREFIX = "libflashgen_torch-"  # + torch's release, "2.11.0", + ".so"


class _State:
    path = None    # the loaded op library, or None
    reason = None  # why it is not loaded
    release_path = None    # the loaded autograd library, or None
    release_reason = None  # why it is not loaded
    release_cdll = None    # the release library through ctypes, once asked for


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
    _load_release(path)
    return path


def _load_release(op_library):
    """Loads the release library built for this torch release, found beside the op library."""
    if os.environ.get("FLASHGEN_RELEASE_LIBRARY", "1") == "0":
        _State.release_reason = "FLASHGEN_RELEASE_LIBRARY=0"
        return
    release = torch.__version__.split("+")[0]
    folder = os.path.dirname(op_library)
    path = os.path.join(folder, f"{RELEASE_LIBRARY_PREFIX}{release}.so")
    if not os.path.exists(path):
        built = sorted(os.path.basename(p) for p in glob.glob(os.path.join(folder, RELEASE_LIBRARY_PREFIX + "*.so")))
        _State.release_reason = (f"{path}: no such file" + (f" (built for other releases: {', '.join(built)})"
                                                              if built else ""))
        return
    try:
        torch.ops.load_library(path)
    except (OSError, RuntimeError) as error:
        _State.release_reason = f"{path} does not load ({error})"
        return
    registered = getattr(torch._C, "_dispatch_has_kernel_for_dispatch_key", None)
    if registered is not None and not registered("flashgen::attention_forward", "Autograd"):
        # A library that loads but registers nothing would leave the ops without autograd: the Python formulas serve.
        _State.release_reason = f"{path} loaded but registered no autograd for flashgen::attention_forward"
        return
    _State.release_path = path


def loaded():
    """Whether the ops run in C++ (the op library is loaded)."""
    return _State.path is not None


def release_library():
    """The loaded release library as a ctypes.CDLL (its extern "C" functions: the SDPA overrides' registration and
    counts), or None."""
    if _State.release_path is None:
        return None
    if _State.release_cdll is None:
        _State.release_cdll = ctypes.CDLL(_State.release_path)
    return _State.release_cdll


def release_loaded():
    """Whether the forward ops' autograd runs in C++ (the release library is loaded)."""
    return _State.release_path is not None


_below_autograd = getattr(torch._C, "_AutoDispatchBelowAutograd", None)
_STATUS_NAMES = {name: status for status, name in _lib.STATUS_NAMES.items()}


def call(op, *args):
    """op(*args) of an eager call, straight to its CUDA kernel (the caller's autograd, if any, is its own), a failure
    of the library raised as flashgen._lib.check raises it: the kernels word their message "call: message [status]"."""
    if _below_autograd is None:
        return call_with_autograd(op, *args)
    with _below_autograd():
        return call_with_autograd(op, *args)


def call_with_autograd(op, *args):
    """op(*args) through the whole dispatcher, its autograd included (the release library's C++ formulas), a failure
    of the library raised as call() raises it."""
    try:
        return op(*args)
    except RuntimeError as error:
        translated = _library_error(error)
        if translated is None:
            raise
        raise translated from None


def _library_error(error):
    """The FlashgenError of a kernel's RuntimeError worded "call: message [status]", or None for another error."""
    message = str(error)
    for name, status in _STATUS_NAMES.items():
        if f"[{name}]" in message:
            return _lib.error_for(status, _CHECK_PLACE.sub("", message.splitlines()[0]))
    return None


# Where torch's STD_TORCH_CHECK says it raised, before the message: "function, file:line, ".
_CHECK_PLACE = re.compile(r"^\w+, \S+:\d+, ")
