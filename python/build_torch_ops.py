"""Builds libflashgen_torch.so, flashgen's PyTorch ops in C++ on torch's stable ABI (python/csrc/), and beside it
libflashgen_torch-<torch version>.so, their autograd in C++ (python/csrc/release/), beside a built
libflashgen: the wheel's build runs it when torch >= 2.10 with its headers is importable (setup.py), and by hand

    python3 python/build_torch_ops.py --flashgen-library build/libflashgen.so [--out build/libflashgen_torch.so]

The op library targets torch's stable ABI of 2.10 (TORCH_TARGET_VERSION), so one build serves every later torch. It
links libflashgen by its SONAME (found beside it through RPATH $ORIGIN) and torch's libtorch_cpu and libtorch_cuda by
name, as torch's own extensions do: the copies the process has loaded with torch satisfy them. The release library
uses torch's C++ API, which the stable ABI lacks, so it serves only the torch release whose headers built it (its
name says which; flashgen.torch loads it under that release only, and runs autograd in Python under any other);
it is optional: a build that fails to compile it warns and keeps the op library.
--torch-include/--torch-lib build against another torch's headers and libraries than the importable one.
"""

import argparse
import concurrent.futures
import os
import pathlib
import re
import shlex
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
SOURCE_TREE = HERE.parent
SOURCES = sorted((HERE / "csrc").glob("*.cpp"))
RELEASE_SOURCES = sorted((HERE / "csrc" / "release").glob("*.cpp"))
LIBRARY_NAME = "libflashgen_torch.so"
RELEASE_LIBRARY_PREFIX = "libflashgen_torch-"
# torch 2.10: the stable ABI's str arguments, new_empty with a dtype, to() and contiguous() start there.
TARGET_VERSION = "0x020a000000000000"


def torch_dirs():
    """(include, lib) folders of the importable torch, or None when there is none, or it has no stable ABI headers."""
    try:
        import torch
    except ImportError:
        return None
    base = pathlib.Path(torch.__file__).resolve().parent
    include, lib = base / "include", base / "lib"
    if not (include / "torch" / "csrc" / "stable" / "library.h").is_file():
        return None
    return include, lib


def release_library_name(torch_version):
    """The release library's file name for a torch release ("2.11.0", or torch.__version__ with its local tag)."""
    return f"{RELEASE_LIBRARY_PREFIX}{torch_version.split('+')[0]}.so"


def headers_version(torch_include):
    """The torch release of an include folder, "2.11.0", from torch/headeronly/version.h."""
    text = (pathlib.Path(torch_include) / "torch" / "headeronly" / "version.h").read_text()
    parts = [re.search(rf"#define TORCH_VERSION_{part} (\d+)", text) for part in ("MAJOR", "MINOR", "PATCH")]
    if not all(parts):
        raise ValueError(f"{torch_include}: torch/headeronly/version.h names no release")
    return ".".join(match.group(1) for match in parts)


def _run(command):
    print("flashgen build:", " ".join(shlex.quote(str(part)) for part in command), flush=True)
    subprocess.run([str(part) for part in command], check=True)


_FLAGS = ["-std=c++17", "-O2", "-fPIC", "-fvisibility=hidden", "-Wall", "-Wextra"]
# Symbols of static archives stay inside the library: a toolchain that links its libstdc++ statically would otherwise
# export the C++ runtime, and torch.ops.load_library opens both libraries RTLD_GLOBAL, so one library's throw would
# meet the other's exception runtime (a crash where an op refuses its arguments).
_LINK_FLAGS = ["-Wl,--exclude-libs,ALL"]


def _link(cxx, sources, flags, out, link_flags, jobs):
    """Compiles sources in parallel and links them into the shared library out."""
    if not sources:
        raise ValueError(f"no sources for {out.name}")
    with tempfile.TemporaryDirectory(prefix="flashgen-torch-ops-") as objects:
        def compile_one(source):
            target = pathlib.Path(objects) / (source.stem + ".o")
            _run([cxx, *flags, "-c", source, "-o", target])
            return target

        with concurrent.futures.ThreadPoolExecutor(jobs or os.cpu_count() or 1) as pool:
            targets = list(pool.map(compile_one, sources))
        # --no-as-needed: torch's libraries are named for the loader's sake (Python loads torch._C with
        # RTLD_LOCAL, so libtorch's symbols are found through this library's own dependencies), not for symbols
        # the link needs resolved.
        _run([cxx, "-shared", "-o", out, *targets, *link_flags, *_LINK_FLAGS])


def build(flashgen_library, out, torch_include, torch_lib, cxx="g++", jobs=None):
    """Compiles python/csrc/*.cpp into out and python/csrc/release/*.cpp into the release library beside it (a
    failure there is reported, not raised); returns out."""
    flashgen_library = pathlib.Path(flashgen_library).resolve()
    out = pathlib.Path(out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)

    def torch_libraries(*names):
        return ["-Wl,--no-as-needed", "-L", torch_lib, *(f"-l{name}" for name in names), "-Wl,--as-needed"]

    flashgen_link = ["-L", flashgen_library.parent, "-l:" + flashgen_library.name, "-Wl,-rpath,$ORIGIN"]
    includes = ["-isystem", torch_include, "-I", SOURCE_TREE / "include"]
    _link(cxx, SOURCES, [*_FLAGS, f"-DTORCH_TARGET_VERSION={TARGET_VERSION}", *includes], out,
          flashgen_link + torch_libraries("torch_cpu", "torch_cuda"), jobs)
    try:
        release = out.parent / release_library_name(headers_version(torch_include))
        api = pathlib.Path(torch_include) / "torch" / "csrc" / "api" / "include"
        _link(cxx, RELEASE_SOURCES, [*_FLAGS, *includes, "-isystem", api], release,
              flashgen_link + torch_libraries("c10", "torch_cpu", "torch_cuda"), jobs)
    except (OSError, ValueError, subprocess.CalledProcessError) as error:
        print(f"flashgen build: the release library was not built ({error}); flashgen.torch runs autograd and the "
              "SDPA overrides in Python", flush=True)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flashgen-library", required=True, help="the built libflashgen.so to link")
    parser.add_argument("--out", help="where to write the library (default: beside --flashgen-library)")
    parser.add_argument("--torch-include", help="torch's include folder (default: the importable torch's)")
    parser.add_argument("--torch-lib", help="the folder of torch's libtorch_cpu.so (default: the importable torch's)")
    parser.add_argument("--cxx", default=os.environ.get("CXX", "g++"))
    args = parser.parse_args()
    if args.torch_include is None or args.torch_lib is None:
        found = torch_dirs()
        if found is None:
            sys.exit("flashgen: no torch with the stable ABI's headers (torch >= 2.10) is importable; pass "
                     "--torch-include and --torch-lib")
        args.torch_include = args.torch_include or found[0]
        args.torch_lib = args.torch_lib or found[1]
    out = args.out or pathlib.Path(args.flashgen_library).resolve().parent / LIBRARY_NAME
    print(build(args.flashgen_library, out, args.torch_include, args.torch_lib, args.cxx))


if __name__ == "__main__":
    main()
