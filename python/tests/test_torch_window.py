"""flashgen.torch's window_size argument (FlashAttention's sliding window): the values it refuses and how causal
turns a window into a causal one, on any machine with torch (meta tensors go through the ops' fake kernels, so
the ops' schemas take the window, attention_with_kvcache's too); on the GPU, attention() and varlen_attention()
outputs and gradients against a float64 reference of the banded mask, and explain() naming the window's kernels
(attention_with_kvcache's window on the GPU: test_torch_kvcache.py).
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
from flashgen.torch import _checks as fg_checks  # noqa: E402


def _meta(*shape):
    return torch.empty(*shape, device="meta", dtype=torch.bfloat16)


@pytest.mark.parametrize("window_size", [(-2, 0), (0, -5), (2 ** 31, 0), (4,), (1, 2, 3), "8,0", (1.5, 2), (True, 0),
                                         None])
def test_a_bad_window_size_is_refused_naming_it(window_size):
    q = _meta(1, 16, 2, 64)
    for call in (lambda: fgt.attention(q, q, q, window_size=window_size),
                 lambda: fgt.explain(q, q, q, window_size=window_size),
                 lambda: fgt.attention_with_kvcache(q, q, q, window_size=window_size)):
        with pytest.raises(flashgen.FlashgenArgumentError, match="window_size") as caught:
            call()
        assert caught.value.status == flashgen._lib.ERROR_INVALID_ARGUMENT


def test_a_window_is_aligned_bottom_right():
    q = _meta(1, 16, 2, 64)
    with pytest.raises(flashgen.FlashgenArgumentError, match="causal_align='top_left'"):
        fgt.attention(q, q, q, causal=True, causal_align="top_left", window_size=(8, 0))
    # Without causal=True the alignment is not read, as for the masks.
    assert fgt.attention(q, q, q, causal_align="top_left", window_size=(8, 0)).shape == q.shape


def test_causal_makes_the_window_causal_as_flashattention_does():
    assert fg_checks._mask_and_window(False, "bottom_right", (-1, -1)) == ("none", (-1, -1))
    assert fg_checks._mask_and_window(True, "bottom_right", (-1, -1)) == ("bottom_right", (-1, -1))
    assert fg_checks._mask_and_window(True, "top_left", [-1, -1]) == ("top_left", (-1, -1))
    assert fg_checks._mask_and_window(False, "bottom_right", (128, 4)) == ("window", (128, 4))
    assert fg_checks._mask_and_window(True, "bottom_right", (128, 4)) == ("window", (128, 0))
    assert fg_checks._mask_and_window(True, "bottom_right", (-1, 4)) == ("window", (-1, 0))


def test_meta_tensors_take_a_window_through_the_ops():
    q, k = _meta(2, 128, 4, 64), _meta(2, 96, 2, 64)
    out, lse = fgt.attention(q, k, k, window_size=(32, 8), return_lse=True)
    assert out.device.type == "meta" and out.shape == q.shape
    assert lse.shape == (2, 4, 128)
    packed = _meta(300, 4, 64)
    cu = torch.tensor([0, 100, 300], dtype=torch.int32, device="meta")
    assert fgt.varlen_attention(packed, packed, packed, cu, cu, 200, 200, causal=True,
                                window_size=(64, 64)).shape == packed.shape


def test_the_kvcache_call_takes_a_window_through_its_op():
    q, cache = _meta(2, 4, 8, 64), _meta(2, 512, 2, 64)
    for window_size, causal in (((128, 0), False), ((100, 20), False), ((100, 20), True), ((-1, 8), False)):
        out, lse = fgt.attention_with_kvcache(q, cache, cache, window_size=window_size, causal=causal,
                                              return_softmax_lse=True)
        assert out.device.type == "meta" and out.shape == q.shape
        assert lse.shape == (2, 8, 4)
    # With a soft cap as well (test_torch_kvcache.py checks the numbers).
    out = fgt.attention_with_kvcache(q, cache, cache, window_size=(128, 0), softcap=30.0)
    assert out.device.type == "meta" and out.shape == q.shape
    # Aligned bottom-right as the dense calls' windows are.
    with pytest.raises(flashgen.FlashgenArgumentError, match="causal_align='top_left'"):
        fgt.attention_with_kvcache(q, cache, cache, causal=True, causal_align="top_left", window_size=(8, 0))


# ---------------------------------------------------------------------------------------------------------
# On the GPU.

def _gpu():
    missing = testsupport.gpu_missing()
    if missing:
        pytest.skip(f"GPU tests skipped: {missing}")


def _windowed_reference(q, k, v, dout, window, scale):
    """out, lse and (dq, dk, dv) in float64 for bshd q, k, v under flashgen.h's window (left, right)."""
    visible = testsupport.window_keys(q.shape[1], k.shape[1], window, q.device)
    return testsupport.float64_bshd_attention(q, k, v, dout, scale, visible)


_assert_close = testsupport.assert_close_to_float64


@pytest.mark.parametrize("dtype,head_dim,sq,sk,window_size,causal", [
    (torch.bfloat16, 128, 300, 300, (100, 0), False),   # a causal window over several key blocks
    (torch.float16, 64, 150, 400, (40, 25), False),     # two-sided, sq < sk
    (torch.float16, 64, 300, 120, (10, 7), True),       # causal=True: (10, 0); rows before 180 see no key
])
def test_attention_window_matches_the_float64_reference(dtype, head_dim, sq, sk, window_size, causal):
    _gpu()
    generator = torch.Generator(device="cuda").manual_seed(head_dim + sq)
    q = torch.randn(2, sq, 4, head_dim, device="cuda", generator=generator).to(dtype).requires_grad_(True)
    k = torch.randn(2, sk, 2, head_dim, device="cuda", generator=generator).to(dtype).requires_grad_(True)
    v = torch.randn(2, sk, 2, head_dim, device="cuda", generator=generator).to(dtype).requires_grad_(True)
    dout = torch.randn(2, sq, 4, head_dim, device="cuda", generator=generator).to(dtype)
    out, lse = fgt.attention(q, k, v, causal=causal, window_size=window_size, return_lse=True)
    out.backward(dout)
    window = (window_size[0], 0) if causal else window_size
    want, want_lse, grads = _windowed_reference(q, k, v, dout, window, 1 / math.sqrt(head_dim))
    _assert_close("out", out, want, dtype)
    live = torch.isfinite(want_lse)
    assert torch.equal(torch.isfinite(lse), live)
    assert testsupport.max_error(lse[live], want_lse[live]) <= 1e-3
    for name, tensor, want_grad in zip(("dq", "dk", "dv"), (q, k, v), grads):
        _assert_close(name, tensor.grad, want_grad, dtype)
    # The window changes the answer: the unwindowed call differs by far more than the tolerance.
    plain = fgt.attention(q.detach(), k.detach(), v.detach(), causal=causal)
    assert testsupport.max_error(plain, want) > 0.05


def test_varlen_attention_window_applies_within_each_sequence():
    _gpu()
    testsupport.check_packed_bf16_self_attention(
        11, [70, 1, 130],
        lambda q, k, v, cu, longest: fgt.varlen_attention(q, k, v, cu, cu, longest, longest, window_size=(16, 4)),
        lambda q, k, v, dout: _windowed_reference(q, k, v, dout, (16, 4), 1 / 8))


def test_explain_names_the_window_kernels_and_the_plain_masks_for_unbounded_windows():
    _gpu()
    q = torch.randn(1, 256, 2, 64, device="cuda", dtype=torch.float16)
    answer = fgt.explain(q, q, q, window_size=(64, 0))
    assert "_window" in answer["forward"]["config"] and "_window" in answer["backward"]["config"]
    # (-1, 0) runs as the bottom-right causal mask, (-1, -1) as no mask.
    assert "_causal" in fgt.explain(q, q, q, window_size=(-1, 0), backward=False)["forward"]["config"]
    plain = fgt.explain(q, q, q, window_size=(-1, -1), backward=False)["forward"]["config"]
    assert "_window" not in plain and "_causal" not in plain
