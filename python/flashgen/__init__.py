"""flashgen: flash-attention CUDA kernels generated and compiled at run time, loaded through ctypes.

`import flashgen` needs no torch; the PyTorch entry points are in `flashgen.torch` (attention, explain, tune).
The shared library is found through $FLASHGEN_LIBRARY, a copy bundled next to this package, the source tree's
build/libflashgen.so, then the system loader (see `flashgen._lib.library_candidates`).
"""

from ._lib import FlashgenArgumentError, FlashgenError, library_path, set_tune_on_first_use, version

__version__ = "0.1.0"  # the library's version this package was written against (flashgen_version())

__all__ = ["FlashgenArgumentError", "FlashgenError", "library_path", "set_tune_on_first_use", "version",
           "__version__"]
