"""Builds the flashgen wheel: CMake configures and builds libflashgen and the flashgen CLI from the source tree
this folder belongs to, installs them into a staging prefix, and the wheel carries them as flashgen/lib and
flashgen/bin (the CLI finds the library beside it through its RPATH, $ORIGIN/../lib).

    pip install --no-build-isolation ./python       (setuptools and wheel from the system: nothing downloaded)

Environment:
    CUDA_HOME                  the CUDA toolkit (default: /usr/local/cuda)
    FLASHGEN_TORCH_OPS         0: no libflashgen_torch.so; 1: it must be built (default: built when torch >= 2.10 is
                               importable at build time, as with pip's --no-build-isolation)
    FLASHGEN_CMAKE_BUILD_DIR   build in (or reuse) this CMake build folder instead of a fresh one under build/
    FLASHGEN_CMAKE_ARGS        extra CMake configure arguments
    FLASHGEN_BUILD_JOBS        parallel build jobs (default: the CPU count)
"""

import os
import pathlib
import shlex
import shutil
import subprocess
import sys
import sysconfig

from setuptools import setup
from setuptools.command.build_py import build_py

try:  # setuptools >= 70.1 has its own; before that it comes from the wheel package
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:
    from wheel.bdist_wheel import bdist_wheel

SOURCE_TREE = pathlib.Path(__file__).resolve().parent.parent


def _run(command, **kwargs):
    print("flashgen build:", " ".join(shlex.quote(str(part)) for part in command), flush=True)
    subprocess.run([str(part) for part in command], check=True, **kwargs)


def build_native(package_dir, build_temp):
    """Builds libflashgen and the CLI with CMake and copies them into package_dir/lib and package_dir/bin."""
    if not (SOURCE_TREE / "CMakeLists.txt").is_file() or not (SOURCE_TREE / "include" / "flashgen").is_dir():
        sys.exit(f"flashgen: {SOURCE_TREE} is not a flashgen source tree; build the wheel from a checkout "
                 "(pip install --no-build-isolation ./python)")
    if shutil.which("cmake") is None:
        sys.exit("flashgen: cmake not found; install it (Debian: apt-get install cmake g++ make "
                 "nlohmann-json3-dev libsqlite3-dev) and the CUDA toolkit, then build again")
    build_dir = pathlib.Path(os.environ.get("FLASHGEN_CMAKE_BUILD_DIR") or pathlib.Path(build_temp) / "cmake")
    stage = pathlib.Path(build_temp) / "stage"
    shutil.rmtree(stage, ignore_errors=True)
    jobs = os.environ.get("FLASHGEN_BUILD_JOBS") or str(os.cpu_count() or 1)
    if not (build_dir / "CMakeCache.txt").is_file():
        _run(["cmake", "-S", SOURCE_TREE, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
              "-DFLASHGEN_BUILD_TESTS=OFF", "-DFLASHGEN_BUILD_BENCH=OFF",
              *shlex.split(os.environ.get("FLASHGEN_CMAKE_ARGS", ""))])
    _run(["cmake", "--build", build_dir, "--target", "flashgen", "flashgen_cli", "-j", jobs])
    _run(["cmake", "--install", build_dir, "--prefix", stage, "--component", "runtime"])

    # The library under its SONAME (libflashgen.so.<major>.<minor>), the name the CLI asks the loader for.
    libraries = sorted(stage.glob("lib*/libflashgen.so.*.*.*"))
    if len(libraries) != 1:
        sys.exit(f"flashgen: expected one libflashgen.so.X.Y.Z under {stage}, found {libraries}")
    soname = ".".join(libraries[0].name.split(".")[:4])
    for folder in ("lib", "bin"):
        shutil.rmtree(package_dir / folder, ignore_errors=True)
        (package_dir / folder).mkdir(parents=True)
    shutil.copy2(libraries[0], package_dir / "lib" / soname)
    shutil.copy2(stage / "bin" / "flashgen", package_dir / "bin" / "flashgen")
    build_torch_ops_beside(package_dir / "lib" / soname)


def build_torch_ops_beside(library):
    """libflashgen_torch.so (flashgen's PyTorch ops in C++, build_torch_ops.py) and its release library beside the
    packaged library, when a torch >= 2.10 with its headers is importable here; without one the wheel's
    flashgen.torch runs its ops through ctypes. FLASHGEN_TORCH_OPS=0 skips it, =1 makes a missing torch an error."""
    wanted = os.environ.get("FLASHGEN_TORCH_OPS", "")
    if wanted == "0":
        return
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    import build_torch_ops
    found = build_torch_ops.torch_dirs()
    if found is None:
        message = "no torch >= 2.10 with its headers is importable"
        if wanted == "1":
            sys.exit(f"flashgen: FLASHGEN_TORCH_OPS=1 but {message}")
        print(f"flashgen build: {message}: not building {build_torch_ops.LIBRARY_NAME} (flashgen.torch runs its ops "
              "through ctypes)", flush=True)
        return
    build_torch_ops.build(library, library.parent / build_torch_ops.LIBRARY_NAME, *found)


class BuildPy(build_py):
    """The package's Python files, then the native library and CLI beside them."""

    def run(self):
        super().run()
        build_temp = pathlib.Path(self.get_finalized_command("build").build_temp)
        build_native(pathlib.Path(self.build_lib) / "flashgen", build_temp)


class BdistWheel(bdist_wheel):
    """A platform wheel (it carries a shared library and an executable) for any Python 3: the package itself is
    pure Python and loads the library with ctypes."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        return "py3", "none", sysconfig.get_platform().replace("-", "_").replace(".", "_")


setup(cmdclass={"build_py": BuildPy, "bdist_wheel": BdistWheel})
