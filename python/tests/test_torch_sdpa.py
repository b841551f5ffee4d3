"""flashgen.torch.enable(): an unchanged torch.nn.functional.scaled_dot_product_attention call runs flashgen's kernels
(counted in sdpa_stats()) and matches a float64 reference, forward and backward, causal or not, grouped-query heads,
inputs laid out as models make them (transposed views); its outputs have the strides torch's kernels give; calls
flashgen does not serve fall back to torch's kernels with the reason counted; disable() and the context manager
restore torch's kernels and SDPA's backend order; torch.compile and CUDA graph capture run flashgen too.
"""

import pytest

import testsupport

_missing = testsupport.gpu_missing()
if _missing:
    pytest.skip(f"GPU tests skipped: {_missing}", allow_module_level=True)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import flashgen.torch as fgt  # noqa: E402

if not hasattr(torch.library, "get_kernel"):
    pytest.skip(f"flashgen.torch.enable() needs torch >= 2.9, this is {torch.__version__}", allow_module_level=True)


@pytest.fixture(autouse=True)
def _off_after_each_test():
    fgt.reset_sdpa_stats()
    yield
    fgt.disable()


def _model_layout(batch, seqlen, heads, head_dim, dtype, generator, requires_grad=False):
    """[batch, heads, seqlen, head_dim] as a model hands it to SDPA: a transposed view of [batch, seqlen, heads, d]."""
    t = torch.randn(batch, seqlen, heads, head_dim, device="cuda", generator=generator).to(dtype)
    return t.transpose(1, 2).requires_grad_(requires_grad)


def _served(direction):
    return fgt.sdpa_stats()[direction].get("flashgen", 0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("heads_q,heads_kv,head_dim,seqlen", [(4, 4, 64, 200), (8, 2, 128, 333), (2, 1, 256, 96)])
def test_sdpa_runs_flashgen_and_matches_float64(dtype, is_causal, heads_q, heads_kv, head_dim, seqlen):
    generator = torch.Generator(device="cuda").manual_seed(seqlen + head_dim)
    q = _model_layout(2, seqlen, heads_q, head_dim, dtype, generator, True)
    k, v = (_model_layout(2, seqlen, heads_kv, head_dim, dtype, generator, True) for _ in range(2))
    dout = torch.randn(2, heads_q, seqlen, head_dim, device="cuda", generator=generator).to(dtype)
    fgt.enable()
    out = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=heads_q != heads_kv)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    assert _served("forward") == 1 and _served("backward") == 1, fgt.sdpa_stats()
    # torch's kernels return out and the gradients with their inputs' strides (empty_like); so must flashgen's.
    assert out.stride() == q.stride() and dq.stride() == q.stride() and dk.stride() == k.stride()

    bshd = [t.detach().transpose(1, 2) for t in (q, k, v, dout)]
    visible = testsupport.visible_keys(seqlen, seqlen, "top_left" if is_causal else "none", "cuda")
    want, _, grads = testsupport.float64_bshd_attention(*bshd, head_dim ** -0.5, visible)
    testsupport.assert_close_to_float64("out", out.transpose(1, 2), want, dtype)
    for name, got, want_grad in zip(("dq", "dk", "dv"), (dq, dk, dv), grads):
        testsupport.assert_close_to_float64(name, got.transpose(1, 2), want_grad, dtype)


def test_fallbacks_are_counted_with_their_reason_and_run_torch_kernels():
    generator = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (_model_layout(1, 128, 2, 64, torch.float16, generator, True) for _ in range(3))
    with fgt.enable():
        torch.manual_seed(0)
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
        out.sum().backward()
        stats = fgt.sdpa_stats()
        assert stats["forward"] == {"fallback: dropout": 1} and stats["backward"] == {"fallback: dropout": 1}
        # Dropout zeroes about half the probabilities: torch's own flash kernel ran (flashgen has no dropout).
        plain = F.scaled_dot_product_attention(q, k, v)
        assert not torch.allclose(out, plain, atol=1e-2)
        # An attn_mask never reaches the flash backend: nothing is counted, the call runs as before.
        mask = torch.ones(128, 128, dtype=torch.bool, device="cuda").tril()
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        assert fgt.sdpa_stats()["forward"] == {"fallback: dropout": 1, "flashgen": 1}


def test_disable_and_the_context_manager_restore_torch():
    generator = torch.Generator(device="cuda").manual_seed(2)
    q, k, v = (_model_layout(1, 64, 2, 64, torch.bfloat16, generator) for _ in range(3))
    order = torch._C._get_sdp_priority_order()
    with fgt.enable() as handle:
        assert fgt.sdpa_stats()["enabled"]
        with fgt.enable():  # already on: the inner block leaves it on
            pass
        assert fgt.sdpa_stats()["enabled"] and handle.turned_on
        assert int(torch._C._get_sdp_priority_order()[0]) == int(torch.nn.attention.SDPBackend.FLASH_ATTENTION)
        F.scaled_dot_product_attention(q, k, v)
    assert not fgt.sdpa_stats()["enabled"]
    assert [int(b) for b in torch._C._get_sdp_priority_order()] == [int(b) for b in order]
    F.scaled_dot_product_attention(q, k, v)
    assert _served("forward") == 1
    if hasattr(torch.nn.attention, "current_flash_attention_impl"):
        fgt.enable()
        assert torch.nn.attention.current_flash_attention_impl() == "flashgen"
        fgt.disable()
        assert torch.nn.attention.current_flash_attention_impl() is None


def test_torch_compile_runs_flashgen():
    generator = torch.Generator(device="cuda").manual_seed(3)
    q, k, v = (_model_layout(2, 256, 4, 64, torch.bfloat16, generator, True) for _ in range(3))
    fgt.enable()

    def block(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).flatten(2) * 2.0

    compiled = torch.compile(block, fullgraph=True)
    out = compiled(q, k, v)
    out.float().square().sum().backward()
    assert _served("forward") >= 1 and _served("backward") >= 1, fgt.sdpa_stats()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    fgt.disable()
    eager = block(q, k, v)
    eager.float().square().sum().backward()
    testsupport.assert_close_to_float64("compiled out", out, eager.double(), torch.bfloat16)
    for name, got, t in zip(("dq", "dk", "dv"), grads, (q, k, v)):
        testsupport.assert_close_to_float64(name, got, t.grad.double(), torch.bfloat16)


def test_cuda_graph_capture_runs_flashgen():
    generator = torch.Generator(device="cuda").manual_seed(4)
    q, k, v = (_model_layout(2, 256, 4, 128, torch.float16, generator) for _ in range(3))
    fgt.enable()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        F.scaled_dot_product_attention(q, k, v, is_causal=True)  # warm-up: the kernel compiles or loads here
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert _served("forward") == 2
    for t in (q, k, v):
        t.copy_(torch.randn(t.shape, device="cuda", generator=generator).to(t.dtype))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    fgt.disable()
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    testsupport.assert_close_to_float64("replayed out", out, want.double(), torch.float16)


def test_the_flashattention2_ops_below_sdpa_run_flashgen():
    # aten::_flash_attention_forward/backward (torch's varlen_attn, nested tensors): packed sequences (odd lengths,
    # a single row) through autograd, then a dense call with a window.
    fgt.enable()

    def attend(q, k, v, cu, longest):
        return torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, longest, longest, 0.0, True, False)[0]

    def reference(q, k, v, dout):
        n = q.shape[1]
        return testsupport.float64_bshd_attention(q, k, v, dout, 64 ** -0.5,
                                                  testsupport.visible_keys(n, n, "bottom_right", "cuda"))

    testsupport.check_packed_bf16_self_attention(7, [33, 100, 1], attend, reference)
    assert _served("forward") == 1 and _served("backward") == 1, fgt.sdpa_stats()

    generator = torch.Generator(device="cuda").manual_seed(8)
    q, k, v = (torch.randn(2, 150, 4, 64, device="cuda", generator=generator).half() for _ in range(3))
    out = torch.ops.aten._flash_attention_forward(q, k, v, None, None, 150, 150, 0.0, True, False,
                                                  window_size_left=32, window_size_right=0)[0]
    assert _served("forward") == 2 and out.stride() == q.stride()
    visible = testsupport.window_keys(150, 150, (32, 0), "cuda")
    want, _, _ = testsupport.float64_bshd_attention(q, k, v, torch.zeros_like(q), 64 ** -0.5, visible)
    testsupport.assert_close_to_float64("windowed out", out, want, torch.float16)


def test_sdpa_overrides_run_in_cpp_where_the_release_library_loads():
    """With the release library loaded, SDPA's flash pair is served by its C++ kernels (python/csrc/release/sdpa.cpp,
    as torch's dispatcher records them) while enabled, and by torch's own once disabled; else by the Python ones."""
    def registrations():
        return torch._C._dispatch_dump("aten::_scaled_dot_product_flash_attention")

    native = fgt.backend(detail=True)["sdpa"] == "native"
    with fgt.enable():
        assert ("sdpa.cpp" in registrations()) == native, registrations()
        generator = torch.Generator(device="cuda").manual_seed(6)
        q, k, v = (_model_layout(2, 96, 4, 64, torch.bfloat16, generator, True) for _ in range(3))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        # torch's kernel returns out with query's strides: a model's transpose back is then a free view.
        assert out.stride() == q.stride()
        out.sum().backward()
        assert _served("forward") == 1 and _served("backward") == 1
    assert "sdpa.cpp" not in registrations()
