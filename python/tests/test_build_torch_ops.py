"""The op libraries' build script, with no torch needed: the release library is named for the torch release whose
headers built it, and flashgen.torch looks for it under the same name."""

import ast
import shutil
import subprocess
import sys

import pytest

import testsupport

sys.path.insert(0, str(testsupport.PYTHON_DIR))
import build_torch_ops  # noqa: E402


def _version_header(folder, text):
    header = folder / "torch" / "headeronly" / "version.h"
    header.parent.mkdir(parents=True)
    header.write_text(text)
    return folder


def test_autograd_library_is_named_for_the_headers_release(tmp_path):
    include = _version_header(tmp_path, "#pragma once\n#define TORCH_VERSION_MAJOR 2\n#define TORCH_VERSION_MINOR 11\n"
                                        "#define TORCH_VERSION_PATCH 0\n#define TORCH_VERSION_ABI_TAG 0\n")
    assert build_torch_ops.headers_version(include) == "2.11.0"
    assert build_torch_ops.release_library_name("2.11.0") == "libflashgen_torch-2.11.0.so"
    # torch.__version__'s local tag (the CUDA build) is not part of the name: the headers do not carry it.
    assert build_torch_ops.release_library_name("2.11.0+cu130") == "libflashgen_torch-2.11.0.so"


def test_headers_without_a_release_are_refused(tmp_path):
    include = _version_header(tmp_path, "#pragma once\n#define TORCH_VERSION \"2.11.0\"\n")
    with pytest.raises(ValueError, match="names no release"):
        build_torch_ops.headers_version(include)


def test_flashgen_torch_looks_for_the_same_name():
    tree = ast.parse((testsupport.PYTHON_DIR / "flashgen" / "torch" / "_native.py").read_text())
    prefixes = [ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                and getattr(node.targets[0], "id", None) == "RELEASE_LIBRARY_PREFIX"]
    assert prefixes == [build_torch_ops.RELEASE_LIBRARY_PREFIX]


def test_each_library_has_its_sources():
    assert {source.name for source in build_torch_ops.RELEASE_SOURCES} >= {"autograd.cpp", "native.cpp", "sdpa.cpp"}
    assert "ops_library.cpp" in {source.name for source in build_torch_ops.SOURCES}
    assert not set(build_torch_ops.SOURCES) & set(build_torch_ops.RELEASE_SOURCES)


def test_static_archives_stay_inside_the_library(tmp_path):
    # A toolchain linking its C++ runtime statically puts it in an archive like this one; were its symbols exported,
    # the two op libraries (both loaded RTLD_GLOBAL) would bind each other's copies.
    cxx, nm, ar = (shutil.which(tool) for tool in ("g++", "nm", "ar"))
    if not (cxx and nm and ar):
        pytest.skip("needs g++, nm and ar")
    (tmp_path / "runtime.cpp").write_text('extern "C" int runtime_entry(int x) { return x + 1; }\n')
    (tmp_path / "op.cpp").write_text('extern "C" int runtime_entry(int);\n'
                                     '__attribute__((visibility("default"))) int op_entry(int x) '
                                     '{ return runtime_entry(x); }\n')
    subprocess.run([cxx, "-fPIC", "-c", tmp_path / "runtime.cpp", "-o", tmp_path / "runtime.o"], check=True)
    subprocess.run([ar, "rcs", tmp_path / "libruntime.a", tmp_path / "runtime.o"], check=True)
    out = tmp_path / "libop.so"
    build_torch_ops._link(cxx, [tmp_path / "op.cpp"], build_torch_ops._FLAGS, out, [tmp_path / "libruntime.a"], 1)
    exported = subprocess.run([nm, "-D", "--defined-only", out], check=True, capture_output=True, text=True).stdout
    assert "op_entry" in exported
    assert "runtime_entry" not in exported
