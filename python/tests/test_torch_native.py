"""flashgen.torch's ops as torch sees them, on the GPU, in whichever backend loaded (backend(): the C++ op library or
ctypes; FLASHGEN_EXPECT_BACKEND=native|ctypes makes the run insist on one): their schemas are the shared text;
importing flashgen.torch pulls in none of torch.compile's machinery; a library error raises FlashgenArgumentError in
either backend; a small model with dense and packed attention exports (torch.export), and its AOTInductor package
runs and matches eager.
"""

import os
import subprocess
import sys

import pytest

import testsupport

_missing = testsupport.gpu_missing()
if _missing:
    pytest.skip(f"GPU tests skipped: {_missing}", allow_module_level=True)

import torch  # noqa: E402

import flashgen  # noqa: E402
import flashgen.torch as fgt  # noqa: E402
from flashgen.torch import _schemas  # noqa: E402


def _randn(*shape, seed, dtype=torch.bfloat16):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", generator=generator).to(dtype)


def test_backend_says_which_path_runs():
    detail = fgt.backend(detail=True)
    assert detail["backend"] == fgt.backend() and fgt.backend() in ("native", "ctypes")
    if fgt.backend() == "native":
        assert os.path.isfile(detail["library"])
    else:
        assert detail["reason"]
    expected = os.environ.get("FLASHGEN_EXPECT_BACKEND")
    if expected:
        assert fgt.backend() == expected, detail
    assert detail["autograd"] in ("native", "python")
    if detail["autograd"] == "native":
        assert os.path.isfile(detail["release_library"]) and fgt.backend() == "native"
    else:
        assert detail["release_reason"]
    expected = os.environ.get("FLASHGEN_EXPECT_AUTOGRAD")
    if expected:
        assert detail["autograd"] == expected, detail


def test_cpp_autograd_matches_the_python_formulas():
    """Where the release library is loaded, eager calls record its C++ nodes, whose gradients equal (bitwise, with
    deterministic=True) those of the Python formulas (_EagerAttention) over the same kernels: dense with grouped heads,
    a window and sinks, and packed."""
    from flashgen.torch import _autograd
    if fgt.backend(detail=True)["autograd"] != "native":
        pytest.skip("the release library is not loaded: " + fgt.backend(detail=True)["release_reason"])
    q = _randn(2, 192, 4, 64, seed=4).requires_grad_()
    k, v = (_randn(2, 160, 2, 64, seed=seed).requires_grad_() for seed in (5, 6))
    sinks = _randn(4, seed=7, dtype=torch.float32).requires_grad_()
    dout = _randn(2, 192, 4, 64, seed=8)
    out = fgt.attention(q, k, v, causal=True, window_size=(48, 0), sinks=sinks, deterministic=True)
    assert "DenseAttention" in out.grad_fn.name(), out.grad_fn.name()
    cpp = torch.autograd.grad(out, (q, k, v, sinks), dout)
    python_out, _ = _autograd._EagerAttention.apply(q, k, v, 0.0, "window", "bshd", True, 0.0, 48, 0, None, sinks,
                                                    0)
    assert torch.equal(out, python_out)
    for name, a, b in zip(("dq", "dk", "dv", "dsinks"), cpp, torch.autograd.grad(python_out, (q, k, v, sinks), dout)):
        assert torch.equal(a, b), name

    packed = [t.detach().reshape(-1, t.shape[2], 64).requires_grad_() for t in (q, k, v)]
    cu_q = torch.tensor([0, 100, 384], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 70, 320], dtype=torch.int32, device="cuda")
    out = fgt.varlen_attention(*packed, cu_q, cu_k, 284, 250, causal=True, deterministic=True)
    assert "VarlenAttention" in out.grad_fn.name(), out.grad_fn.name()
    grads = torch.autograd.grad(out, packed, dout.reshape(-1, 4, 64))
    for i, (start_q, end_q, start_k, end_k) in enumerate(((0, 100, 0, 70), (100, 384, 70, 320))):
        one = fgt.attention(*(t[None, a:b] for t, (a, b) in zip(packed, ((start_q, end_q), (start_k, end_k),
                                                                         (start_k, end_k)))),
                            causal=True, deterministic=True)
        expected = torch.autograd.grad(one, packed, dout.reshape(-1, 4, 64)[None, start_q:end_q])
        torch.testing.assert_close(grads[0][start_q:end_q], expected[0][start_q:end_q], rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(grads[1][start_k:end_k], expected[1][start_k:end_k], rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(grads[2][start_k:end_k], expected[2][start_k:end_k], rtol=2e-2, atol=2e-2)


def test_cpp_nodes_direct_calls_equal_the_ops_kernels():
    """Where the release library is loaded, eager calls run the ops' CUDA kernels directly (ATen, no boxing) and a
    call under a dispatch mode goes through the ops: both give the same bits, with ALiBi slopes whose rows are strided
    and bfloat16 sinks (each converted), dense and packed, and the profiler names the op either way."""
    from torch.utils._python_dispatch import TorchDispatchMode
    if fgt.backend(detail=True)["autograd"] != "native":
        pytest.skip("the release library is not loaded: " + fgt.backend(detail=True)["release_reason"])

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.add(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    q = _randn(2, 192, 4, 64, seed=30).requires_grad_()
    k, v = (_randn(2, 160, 2, 64, seed=seed).requires_grad_() for seed in (31, 32))
    slopes = torch.rand(2, 8, device="cuda")[:, ::2]
    sinks = _randn(4, seed=33).requires_grad_()
    dout = _randn(2, 192, 4, 64, seed=34)

    def dense():
        out = fgt.attention(q, k, v, causal=True, alibi_slopes=slopes, sinks=sinks, deterministic=True)
        return (out, *torch.autograd.grad(out, (q, k, v, sinks), dout))

    packed = [t.detach().reshape(-1, t.shape[2], 64).requires_grad_() for t in (q, k, v)]
    cu_q = torch.tensor([0, 100, 384], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 70, 320], dtype=torch.int32, device="cuda")

    def varlen():
        out = fgt.varlen_attention(*packed, cu_q, cu_k, 284, 250, causal=True, sinks=sinks, deterministic=True)
        return (out, *torch.autograd.grad(out, (*packed, sinks), dout.reshape(-1, 4, 64)))

    for name, run in (("attention", dense), ("varlen_attention", varlen)):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
            direct = run()
        events = {event.name for event in profile.events()}
        assert {f"flashgen::{name}_forward", f"flashgen::{name}_backward"} <= events, sorted(events)
        with Seen() as seen:
            through_ops = run()
        assert {f"flashgen.{name}_forward", f"flashgen.{name}_backward"} <= seen.ops, seen.ops
        for what, a, b in zip(("out", "dq", "dk", "dv", "dsinks"), direct, through_ops):
            assert torch.equal(a, b), f"{name}: {what}"


def test_op_schemas_are_the_shared_text():
    for name, schema in {**_schemas.SCHEMAS, **_schemas.VARIANT_SCHEMAS}.items():
        op = getattr(torch.ops.flashgen, name).default
        assert op._schema == torch._C.parse_schema(f"flashgen::{name}{schema}"), (name, str(op._schema))


def test_import_pulls_in_no_compiler_machinery():
    code = ("import sys, torch; import flashgen.torch; "
            "print(sorted(m for m in ('torch._dynamo', 'torch._inductor', 'sympy') if m in sys.modules))")
    env = dict(os.environ, PYTHONPATH=str(testsupport.PYTHON_DIR) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def test_library_errors_raise_flashgen_argument_error():
    """Without and with autograd (the kept ctypes arguments, the op's kernel or the release library's direct call):
    the library's message, worded "call: message [status]" with no C++ source place before it."""
    q = _randn(1, 16, 2, 100, seed=1, dtype=torch.float16)
    for grad in (False, True):
        with pytest.raises(flashgen.FlashgenArgumentError, match=r"head_dim\) = 100 is unsupported") as caught:
            fgt.attention(q.requires_grad_(grad), q, q)
        assert caught.value.status == 2 and str(caught.value).startswith("flashgen_attention_forward: "), caught.value


class _Attention(torch.nn.Module):
    """A projection, dense causal attention over the batch, then packed attention over its sequences."""

    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(width, 3 * width, bias=False)

    def forward(self, x, cu_seqlens):
        batch, seqlen, width = x.shape
        q, k, v = self.qkv(x).view(batch, seqlen, 3, self.heads, width // self.heads).unbind(2)
        dense = fgt.attention(q, k, v, causal=True)
        # max_seqlen: at least the longest sequence (a bound, not a length; rows past it are not computed).
        packed = fgt.varlen_attention(*(t.reshape(batch * seqlen, self.heads, -1) for t in (q, k, v)), cu_seqlens,
                                      cu_seqlens, batch * seqlen, batch * seqlen, causal=True)
        return dense + packed.view(batch, seqlen, self.heads, -1)


def test_export_and_aoti_package_match_eager(tmp_path):
    model = _Attention(256, 4).cuda().to(torch.bfloat16)
    x = _randn(2, 128, 256, seed=2)
    cu_seqlens = torch.tensor([0, 100, 256], dtype=torch.int32, device="cuda")
    with torch.no_grad():
        eager = model(x, cu_seqlens)
        exported = torch.export.export(model, (x, cu_seqlens))
        names = {str(node.target) for node in exported.graph.nodes if node.op == "call_function"}
        assert {"flashgen.attention_forward.default", "flashgen.varlen_attention_forward.default"} <= names, names
        torch.testing.assert_close(exported.module()(x, cu_seqlens), eager, rtol=1e-2, atol=1e-2)
        package = torch._inductor.aoti_compile_and_package(exported, package_path=str(tmp_path / "model.pt2"))
        loaded = torch._inductor.aoti_load_package(package)
        x2 = _randn(2, 128, 256, seed=3)
        # Inductor may pick other GEMM kernels for the projection: equal up to bf16 rounding.
        torch.testing.assert_close(loaded(x2, cu_seqlens), model(x2, cu_seqlens), rtol=2e-2, atol=2e-2)
