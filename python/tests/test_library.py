"""libflashgen through ctypes, with no torch and no GPU needed: where the library is looked for and what the error
says when it is not found, the version, the ctypes mirror of flashgen.h, and the C ABI's argument checks surfacing
as Python exceptions that carry the library's message."""

import ctypes
import ctypes.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

import testsupport

import flashgen
from flashgen import _lib

_missing = testsupport.library_missing()
if _missing:
    pytest.skip(f"libflashgen not found here: {_missing}", allow_module_level=True)


def _fake_pointer(n):
    """Never dereferenced: the checks refuse the call first. 16-byte aligned like real allocations."""
    return 0x100000 + n * 0x1000000


def _bshd(n, batch, seqlen, heads, head_dim, dtype=_lib.FLOAT16):
    view = _lib.Tensor()
    view.data = _fake_pointer(n)
    view.dtype = dtype
    view.shape = (ctypes.c_int64 * 4)(batch, seqlen, heads, head_dim)
    view.stride = (ctypes.c_int64 * 4)(seqlen * heads * head_dim, heads * head_dim, head_dim, 1)
    return view


class _Call:
    """A valid backward-shaped argument set: q, out, dout, dq [2, 100, 8, 64]; k, v, dk, dv [2, 75, 4, 64]."""

    def __init__(self):
        self.q, self.out, self.dout, self.dq = (_bshd(n, 2, 100, 8, 64) for n in (1, 4, 5, 6))
        self.k, self.v, self.dk, self.dv = (_bshd(n, 2, 75, 4, 64) for n in (2, 3, 7, 8))
        self.lse = ctypes.c_void_p(_fake_pointer(9))
        self.options = _lib.AttentionOptions(0.0, _lib.MASK_CAUSAL, 0)

    def forward(self):
        refs = [ctypes.byref(t) for t in (self.q, self.k, self.v, self.out)]
        return _lib.function("flashgen_attention_forward")(*refs, self.lse, ctypes.byref(self.options), None)

    def backward_arguments(self):
        refs = [ctypes.byref(t) for t in (self.q, self.k, self.v, self.out, self.dout)]
        grads = [ctypes.byref(t) for t in (self.dq, self.dk, self.dv)]
        return (*refs, self.lse, *grads, ctypes.byref(self.options))


def _raised(status, call):
    with pytest.raises(flashgen.FlashgenError) as caught:
        _lib.check(status, call)
    return caught.value


def test_version_matches_the_package():
    # One version everywhere: the library (and with it the CLI), the Python package and its wheel, CMake's project.
    assert flashgen.version() == flashgen.__version__
    cmake_project = re.search(r"project\(flashgen VERSION ([0-9.]+)", (testsupport.REPO_ROOT / "CMakeLists.txt").read_text())
    assert cmake_project and cmake_project.group(1) == flashgen.__version__
    assert os.path.exists(flashgen.library_path())


_MIRRORS = {"flashgen_tensor": _lib.Tensor, "flashgen_attention_options": _lib.AttentionOptions,
            "flashgen_variant_arg": _lib.VariantArg, "flashgen_variant_desc": _lib.VariantDesc,
            "flashgen_forward_problem": _lib.ForwardProblem, "flashgen_varlen_forward_args": _lib.VarlenForwardArgs,
            "flashgen_varlen_backward_args": _lib.VarlenBackwardArgs, "flashgen_kvcache_args": _lib.KvCacheArgs}


def test_struct_layouts_mirror_flashgen_h(tmp_path):
    # The C compiler's layout of each struct of flashgen.h, every field's offset and the struct's size, against the
    # ctypes mirror's: a field added, moved or retyped on one side only shows here.
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to read flashgen.h's layouts with")
    include = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "include")
    lines = ["#include <stddef.h>", "#include <stdio.h>", "#include <flashgen/flashgen.h>", "int main(void) {"]
    for struct, mirror in _MIRRORS.items():
        lines.append(f'  printf("{struct} sizeof %zu\\n", sizeof({struct}));')
        lines += [f'  printf("{struct} {name} %zu\\n", offsetof({struct}, {name}));' for name, _ in mirror._fields_]
    lines += ["  return 0;", "}"]
    (tmp_path / "layouts.c").write_text("\n".join(lines) + "\n")
    subprocess.run([compiler, "-std=c99", "-I", include, str(tmp_path / "layouts.c"), "-o", str(tmp_path / "layouts")],
                   check=True)
    printed = subprocess.run([str(tmp_path / "layouts")], check=True, capture_output=True, text=True).stdout
    c_layout = {(struct, field): int(value) for struct, field, value in (line.split() for line in printed.splitlines())}
    ctypes_layout = {}
    for struct, mirror in _MIRRORS.items():
        ctypes_layout[(struct, "sizeof")] = ctypes.sizeof(mirror)
        ctypes_layout.update({(struct, name): getattr(mirror, name).offset for name, _ in mirror._fields_})
    assert ctypes_layout == c_layout
    # The options grew to 104 bytes with their size and to 176 with the FP8 descales; the structs that embed them with it.
    assert c_layout[("flashgen_attention_options", "sizeof")] == 176
    assert c_layout[("flashgen_varlen_forward_args", "sizeof")] == 576


def test_attention_options_carry_their_size():
    assert _lib.AttentionOptions().size == ctypes.sizeof(_lib.AttentionOptions)
    options = _lib.AttentionOptions(0.5, _lib.MASK_CAUSAL, 1)
    assert (options.size, options.softmax_scale, options.mask, options.deterministic) == (176, 0.5, 1, 1)


def test_search_order():
    saved = os.environ.pop("FLASHGEN_LIBRARY", None)
    try:
        candidates = _lib.library_candidates()
        assert [description for description, _ in candidates] == [
            "bundled with the package", "the source tree's build", "the system loader (LD_LIBRARY_PATH, ldconfig)"]
        # No wheel build here: the bundled place is named by the plain name (the wheel's copy is lib/libflashgen.so.X.Y).
        assert candidates[0][1] == os.path.join(os.path.dirname(_lib.__file__), "lib", "libflashgen.so")
        assert candidates[1][1] == str(testsupport.REPO_ROOT / "build" / "libflashgen.so")
        os.environ["FLASHGEN_LIBRARY"] = "/opt/x/libflashgen.so"
        assert _lib.library_candidates() == [("FLASHGEN_LIBRARY", "/opt/x/libflashgen.so")]
        # A relative path (a bare name too) is the file in the current directory, not a loader search.
        os.environ["FLASHGEN_LIBRARY"] = "libflashgen.so"
        assert _lib.library_candidates() == [("FLASHGEN_LIBRARY", os.path.join(os.getcwd(), "libflashgen.so"))]
    finally:
        os.environ.pop("FLASHGEN_LIBRARY", None)
        if saved is not None:
            os.environ["FLASHGEN_LIBRARY"] = saved


def _version_in_fresh_process(package_parent, environment):
    """Runs `flashgen.version()` in a new interpreter (a fresh loader) and returns (exit code, output)."""
    env = {key: value for key, value in os.environ.items() if key not in ("FLASHGEN_LIBRARY", "LD_LIBRARY_PATH")}
    env.update(environment)
    env["PYTHONPATH"] = str(package_parent)
    done = subprocess.run([sys.executable, "-c", "import flashgen; print(flashgen.version())"], env=env,
                          capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout + done.stderr


def test_not_found_error_lists_every_place_tried():
    # A copy of the package outside the source tree: no bundled library, no build/ beside it.
    with tempfile.TemporaryDirectory() as folder:
        shutil.copytree(testsupport.PYTHON_DIR / "flashgen", os.path.join(folder, "flashgen"),
                        ignore=shutil.ignore_patterns("*.so", "__pycache__"))
        code, output = _version_in_fresh_process(folder, {})
        assert code != 0
        assert "libflashgen.so not found" in output
        assert os.path.join(folder, "flashgen", "lib", "libflashgen.so") + " (bundled with the package): no such file" in output
        assert "through the system loader" in output
        assert "FLASHGEN_LIBRARY" in output

        # FLASHGEN_LIBRARY names the one place to look.
        missing = os.path.join(folder, "nowhere", "libflashgen.so")
        code, output = _version_in_fresh_process(folder, {"FLASHGEN_LIBRARY": missing})
        assert code != 0
        assert f"{missing} (FLASHGEN_LIBRARY): no such file" in output

        # A file that is there but is no library: the loader's own error, not a search elsewhere.
        bogus = os.path.join(folder, "libflashgen.so")
        with open(bogus, "w") as f:
            f.write("not a library\n")
        code, output = _version_in_fresh_process(folder, {"FLASHGEN_LIBRARY": bogus})
        assert code != 0
        assert f"cannot load {bogus} (FLASHGEN_LIBRARY)" in output

        # A shared library that loads but is not flashgen's: said so, not a recursion or a missing symbol.
        other = ctypes.util.find_library("m")
        libm = next((os.path.join(d, other) for d in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64",
                                                       "/usr/lib64", "/lib", "/usr/lib")
                     if other and os.path.exists(os.path.join(d, other))), None)
        if libm is not None:
            code, output = _version_in_fresh_process(folder, {"FLASHGEN_LIBRARY": libm})
            assert code != 0
            assert "loads but is not libflashgen" in output and "RecursionError" not in output


def test_loads_through_flashgen_library():
    code, output = _version_in_fresh_process(testsupport.PYTHON_DIR, {"FLASHGEN_LIBRARY": flashgen.library_path()})
    assert code == 0, output
    assert output.strip() == flashgen.__version__


def test_statuses_map_to_exception_types():
    for status in (_lib.ERROR_INVALID_ARGUMENT, _lib.ERROR_UNSUPPORTED):
        error = _lib.error_for(status, "m")
        assert isinstance(error, flashgen.FlashgenArgumentError) and isinstance(error, ValueError)
        assert error.status == status
    for status in (_lib.ERROR_NO_DEVICE, _lib.ERROR_COMPILE, _lib.ERROR_CUDA, _lib.ERROR_INTERNAL):
        error = _lib.error_for(status, "m")
        assert isinstance(error, flashgen.FlashgenError) and isinstance(error, RuntimeError)
        assert not isinstance(error, ValueError)
    _lib.check(_lib.SUCCESS, "nothing")  # no exception


@pytest.mark.parametrize("mutate, status, message", [
    (lambda c: setattr(c.q, "data", None), _lib.ERROR_INVALID_ARGUMENT, "q.data: null pointer"),
    (lambda c: c.k.shape.__setitem__(0, 3), _lib.ERROR_INVALID_ARGUMENT,
     "k.shape[0] (batch) is 3 but q.shape[0] (batch) is 2"),
    (lambda c: c.v.stride.__setitem__(3, 2), _lib.ERROR_INVALID_ARGUMENT, "v.stride[3] must be 1"),
    (lambda c: setattr(c.options, "mask", 7), _lib.ERROR_INVALID_ARGUMENT, "opts.mask: unknown value 7"),
    (lambda c: [t.shape.__setitem__(3, 100) for t in (c.q, c.k, c.v, c.out)], _lib.ERROR_UNSUPPORTED,
     "q.shape[3] (head_dim) = 100 is unsupported"),
    (lambda c: setattr(c, "options", _lib.AttentionOptions(0.0, _lib.MASK_SLIDING_WINDOW, 0, 0.0, -2, 0)),
     _lib.ERROR_INVALID_ARGUMENT, "opts.window_left must be >= 0, or -1 for no bound on that side, got -2"),
    (lambda c: setattr(c, "options", _lib.AttentionOptions(0.0, _lib.MASK_SLIDING_WINDOW, 0, 0.0, 16, -9)),
     _lib.ERROR_INVALID_ARGUMENT, "opts.window_right must be >= 0, or -1 for no bound on that side, got -9"),
    (lambda c: setattr(c.options, "attention_chunk", -3), _lib.ERROR_INVALID_ARGUMENT,
     "opts.attention_chunk must be >= 0 (0: none), got -3"),
    (lambda c: [setattr(c.options, "mask", _lib.MASK_CAUSAL_TOP_LEFT), setattr(c.options, "attention_chunk", 64)],
     _lib.ERROR_INVALID_ARGUMENT, "opts.attention_chunk: chunks lie about the bottom-right diagonal"),
    (lambda c: setattr(c.options, "size", 96), _lib.ERROR_INVALID_ARGUMENT,
     "opts.size is 96; this flashgen's options struct has 176 bytes"),
], ids=["null-data", "batch", "stride", "mask", "head-dim", "window-left", "window-right", "chunk", "chunk-top-left",
        "options-size"])
def test_forward_errors_carry_the_library_message(mutate, status, message):
    call = _Call()
    mutate(call)
    error = _raised(call.forward(), "flashgen_attention_forward")
    assert error.status == status
    assert isinstance(error, flashgen.FlashgenArgumentError)
    assert message in str(error)
    assert str(error).startswith("flashgen_attention_forward: ")


def test_backward_workspace_calls_check_their_arguments():
    call = _Call()
    size = _lib.function("flashgen_attention_backward_workspace_size")
    status = size(*call.backward_arguments(), None, None)
    assert "workspace_bytes: null pointer" in str(_raised(status, "size"))
    call.dk.shape[2] = 8
    status = size(*call.backward_arguments(), None, ctypes.byref(ctypes.c_size_t()))
    assert "dk.shape[2] (heads) is 8 but k.shape[2]" in str(_raised(status, "size"))

    call = _Call()
    launch = _lib.function("flashgen_attention_backward_with_workspace")
    status = launch(*call.backward_arguments(), ctypes.c_void_p(_fake_pointer(10) + 128), 1 << 20, None)
    assert "workspace: pointer must be 256-byte aligned" in str(_raised(status, "launch"))
    status = launch(*call.backward_arguments(), None, 1 << 20, None)
    assert "workspace: null pointer" in str(_raised(status, "launch"))


def test_explain_and_tune_check_their_arguments():
    call = _Call()
    call.v.shape[1] = 74
    refs = [ctypes.byref(t) for t in (call.q, call.k, call.v, call.out)]
    with pytest.raises(flashgen.FlashgenArgumentError, match=r"v\.shape\[1\] \(seqlen\) is 74"):
        _lib.call_json("flashgen_explain_forward", *refs, call.lse, ctypes.byref(call.options), None)
    call = _Call()
    call.dv.data = None
    with pytest.raises(flashgen.FlashgenArgumentError, match=r"dv\.data: null pointer"):
        _lib.call_json("flashgen_explain_backward", *call.backward_arguments(), None)

    problem = _lib.ForwardProblem(_lib.BFLOAT16, _lib.MASK_CAUSAL, 2, 512, 512, 7, 2, 64)
    with pytest.raises(flashgen.FlashgenArgumentError, match="problem.heads_q = 7 must be a multiple of"):
        _lib.call_json("flashgen_tune_forward", ctypes.byref(problem), None)
    problem.heads_q, problem.head_dim = 8, 100
    with pytest.raises(flashgen.FlashgenArgumentError, match="problem.head_dim = 100 is unsupported") as caught:
        _lib.call_json("flashgen_tune_forward", ctypes.byref(problem), None)
    assert caught.value.status == _lib.ERROR_UNSUPPORTED


def test_valid_call_reaches_the_device_check():
    status = _Call().forward()
    message = _lib.last_error()
    if status == _lib.ERROR_NO_DEVICE:  # no driver here: the valid call fails only for want of a GPU
        error = _raised(status, "flashgen_attention_forward")
        assert not isinstance(error, ValueError)
        assert message and message in str(error)
    else:  # a driver: the fake pointers are refused as not device memory
        assert status == _lib.ERROR_INVALID_ARGUMENT, message
        assert "not device memory" in message


def test_call_json_grows_its_buffer():
    answer = {"config": "x" * 40000, "reason": "long"}
    text = json.dumps(answer).encode()
    calls = []

    def fake(*args):
        buffer, capacity, length = args[-3:]
        calls.append(capacity)
        length[0] = len(text)
        if capacity <= len(text):
            return _lib.ERROR_INVALID_ARGUMENT
        ctypes.memmove(buffer, text + b"\0", len(text) + 1)
        return _lib.SUCCESS

    real = _lib.function
    _lib.function = lambda name: fake
    try:
        assert _lib.call_json("flashgen_explain_forward", "argument") == answer
    finally:
        _lib.function = real
    assert calls == [1 << 14, len(text) + 1]


def test_tune_on_first_use_switch_reaches_the_library():
    calls = []
    real = _lib.function
    _lib.function = lambda name: (lambda *args: calls.append((name, args)))
    try:
        flashgen.set_tune_on_first_use(True)
        flashgen.set_tune_on_first_use(False)
    finally:
        _lib.function = real
    assert calls == [("flashgen_set_tune_on_first_use", (1,)), ("flashgen_set_tune_on_first_use", (0,))]
    flashgen.set_tune_on_first_use(False)  # the real switch, declared and callable


def test_release_cached_memory_reaches_the_library():
    calls = []
    real = _lib.function
    _lib.function = lambda name: (lambda *args: calls.append((name, args)) or 0)
    try:
        flashgen.release_cached_memory()
    finally:
        _lib.function = real
    assert calls == [("flashgen_release_cached_memory", ())]
    flashgen.release_cached_memory()  # the real call: nothing to give back, with or without a GPU
