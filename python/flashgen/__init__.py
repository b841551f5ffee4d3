"""flashgen: flash-attention CUDA kernels generated and compiled at run time, loaded through ctypes.

`import flashgen` needs no torch; the PyTorch entry points are in `flashgen.torch` (attention, explain, tune).
The shared library is found through $FLASHGEN_LIBRARY, the copy a wheel bundles (flashgen/lib/), the source tree's
build/libflashgen.so, then the system loader (see `flashgen._lib.library_candidates`). A wheel also carries the
`flashgen` command line tool (flashgen/bin/, run by the `flashgen` entry point).
"""

from ._lib import (FlashgenArgumentError, FlashgenError, library_path, release_cached_memory, set_tune_on_first_use,
                   version)

__version__ = "0.1.0"  # the library's version (flashgen_version()), the CLI's and the wheel's: one number, tested

__all__ = ["FlashgenArgumentError", "FlashgenError", "library_path", "release_cached_memory", "set_tune_on_first_use",
           "version", "__version__"]
