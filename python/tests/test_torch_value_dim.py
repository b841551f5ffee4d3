"""flashgen.torch with values of a head dim of their own (MLA's prefill: q and k of 192, v of 128): on any machine with
torch, the output's and the gradients' shapes through the ops' fake kernels (meta tensors, both layouts, packed
batches); on the GPU, attention() and varlen_attention() outputs, lse and gradients against a float64 reference, the
Hopper or sm80 config explain() names, and torch.compile.
"""

import math

import pytest

import testsupport

_missing = testsupport.torch_missing()
if _missing:
    pytest.skip(f"flashgen.torch tests skipped: {_missing}", allow_module_level=True)

import torch  # noqa: E402

import flashgen  # noqa: E402
import flashgen.torch as fgt  # noqa: E402


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, device="meta", dtype=dtype)


def test_the_output_takes_the_values_head_dim_through_the_fake_kernels():
    q, k, v = _meta(2, 100, 4, 192), _meta(2, 80, 2, 192), _meta(2, 80, 2, 128)
    out, lse = fgt.attention(q, k, v, causal=True, return_lse=True)
    assert out.shape == (2, 100, 4, 128) and lse.shape == (2, 4, 100)
    bhsd = fgt.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), layout="bhsd")
    assert bhsd.shape == (2, 4, 100, 128)
    packed_q, packed_k, packed_v = _meta(300, 4, 192), _meta(250, 2, 192), _meta(250, 2, 128)
    cu_q = torch.tensor([0, 100, 300], dtype=torch.int32, device="meta")
    cu_k = torch.tensor([0, 50, 250], dtype=torch.int32, device="meta")
    assert fgt.varlen_attention(packed_q, packed_k, packed_v, cu_q, cu_k, 200, 200).shape == (300, 4, 128)


def test_gradients_take_each_inputs_head_dim_through_the_fake_kernels():
    q, k, v = (_meta(1, 64, 2, d).requires_grad_(True) for d in (192, 192, 128))
    fgt.attention(q, k, v, causal=True).sum().backward()
    assert (q.grad.shape, k.grad.shape, v.grad.shape) == (q.shape, k.shape, v.shape)
    cu = torch.tensor([0, 64], dtype=torch.int32, device="meta")
    packed = [t[0].detach().requires_grad_(True) for t in (q, k, v)]
    fgt.varlen_attention(*packed, cu, cu, 64, 64).sum().backward()
    assert [t.grad.shape for t in packed] == [t.shape for t in packed]


_gpu_missing = testsupport.gpu_missing()
gpu = pytest.mark.skipif(_gpu_missing is not None, reason=f"needs a GPU: {_gpu_missing}")


def _inputs(batch, seqlen_q, seqlen_k, heads_q, heads_kv, d, d_v, dtype, seed):
    generator = torch.Generator(device="cuda").manual_seed(seed)

    def normal(*shape):
        return torch.randn(*shape, generator=generator, device="cuda", dtype=torch.float32).to(dtype)

    return (normal(batch, seqlen_q, heads_q, d), normal(batch, seqlen_k, heads_kv, d),
            normal(batch, seqlen_k, heads_kv, d_v))


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d,d_v", [(192, 128), (128, 64), (64, 256), (96, 40), (64, 512)])
@pytest.mark.parametrize("mask", ["none", "bottom_right"])
def test_attention_matches_float64(dtype, d, d_v, mask):
    # seqlen_q > seqlen_k: under the bottom-right causal mask the first rows see no key.
    q, k, v = _inputs(2, 150, 120, 4, 2, d, d_v, dtype, seed=d + d_v)
    scale = 1.0 / math.sqrt(d)
    for layout in ("bshd", "bhsd"):
        args = (q, k, v) if layout == "bshd" else tuple(t.transpose(1, 2) for t in (q, k, v))
        out, lse = fgt.attention(*args, causal=mask != "none", layout=layout, return_lse=True)
        if layout == "bhsd":
            out = out.transpose(1, 2)
        assert out.shape == (2, 150, 4, d_v)
        visible = testsupport.visible_keys(150, 120, mask, q.device)
        want, want_lse, _ = testsupport.float64_bshd_attention(q, k, v, torch.zeros(out.shape, device="cuda"), scale,
                                                             visible)
        testsupport.assert_close_to_float64(f"out {layout}", out, want, dtype)
        finite = torch.isfinite(want_lse)
        assert torch.equal(torch.isfinite(lse), finite)
        assert (lse[finite].double() - want_lse[finite]).abs().max().item() < 1e-3


@gpu
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("d,d_v", [(192, 128), (128, 64), (64, 128), (64, 512)])
def test_gradients_match_float64(d, d_v, deterministic):
    # bottom-right causal with seqlen_q > seqlen_k: the first rows see no key and give no gradient.
    q, k, v = (t.requires_grad_(True) for t in _inputs(2, 150, 120, 4, 2, d, d_v, torch.bfloat16, seed=d * d_v))
    dout = torch.randn(2, 150, 4, d_v, device="cuda", dtype=torch.bfloat16)
    out = fgt.attention(q, k, v, causal=True, deterministic=deterministic)
    out.backward(dout)
    visible = testsupport.visible_keys(150, 120, "bottom_right", q.device)
    want, _, grads = testsupport.float64_bshd_attention(q, k, v, dout, 1.0 / math.sqrt(d), visible)
    testsupport.assert_close_to_float64("out", out, want, torch.bfloat16)
    for name, got, want_grad in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad), grads):
        assert got.shape == want_grad.shape
        testsupport.assert_close_to_float64(name, got, want_grad, torch.bfloat16)


@gpu
def test_varlen_attention_matches_each_sequence():
    lens_q, lens_k = [1, 0, 77, 300, 5], [1, 3, 77, 513, 0]
    q, k, v = (t[0] for t in _inputs(1, sum(lens_q), sum(lens_k), 4, 2, 192, 128, torch.bfloat16, seed=7))
    cu_q, cu_k = testsupport.packed_offsets(lens_q), testsupport.packed_offsets(lens_k)
    out = fgt.varlen_attention(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True)
    assert out.shape == (sum(lens_q), 4, 128)
    start_q = start_k = 0
    for lq, lk in zip(lens_q, lens_k):
        if lq > 0:
            got = out[start_q:start_q + lq]
            if lk == 0:
                assert torch.equal(got, torch.zeros_like(got))
            else:
                visible = testsupport.visible_keys(lq, lk, "bottom_right", q.device)
                want, _, _ = testsupport.float64_bshd_attention(
                    q[None, start_q:start_q + lq], k[None, start_k:start_k + lk], v[None, start_k:start_k + lk],
                    torch.zeros(1, lq, 4, 128, device="cuda"), 1.0 / math.sqrt(192), visible)
                testsupport.assert_close_to_float64("varlen out", got[None], want, torch.bfloat16)
        start_q, start_k = start_q + lq, start_k + lk


@gpu
def test_explain_names_a_config_of_both_dims_and_compile_runs_it():
    q, k, v = _inputs(1, 256, 256, 4, 4, 192, 128, torch.bfloat16, seed=3)
    answer = fgt.explain(q, k, v, causal=True, backward=False)
    assert "_d192_v128_" in answer["forward"]["config"]
    eager = fgt.attention(q, k, v, causal=True)
    compiled = torch.compile(lambda q, k, v: fgt.attention(q, k, v, causal=True), fullgraph=True)(q, k, v)
    assert compiled.shape == (1, 256, 4, 128)
    assert torch.equal(compiled, eager)


@gpu
@pytest.mark.parametrize("deterministic", [False, True])
def test_keys_of_512_forward_and_gradients_match_float64(deterministic):
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("keys of 512 run on the Hopper family only")
    q, k, v = (t.requires_grad_(True) for t in _inputs(2, 150, 120, 4, 1, 512, 512, torch.bfloat16, seed=512))
    dout = torch.randn(2, 150, 4, 512, device="cuda", dtype=torch.bfloat16)
    out, lse = fgt.attention(q, k, v, causal=True, return_lse=True, deterministic=deterministic)
    out.backward(dout)
    visible = testsupport.visible_keys(150, 120, "bottom_right", q.device)
    want, want_lse, grads = testsupport.float64_bshd_attention(q, k, v, dout, 1.0 / math.sqrt(512), visible)
    testsupport.assert_close_to_float64("out", out, want, torch.bfloat16)
    finite = torch.isfinite(want_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    assert (lse[finite].double() - want_lse[finite]).abs().max().item() < 1e-3
    for name, got, want_grad in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad), grads):
        testsupport.assert_close_to_float64(name, got, want_grad, torch.bfloat16)
    assert "bwd_sm80_bf16_d512_" in fgt.explain(q, k, v, causal=True, deterministic=deterministic)["backward"]["config"]