"""flashgen.torch inside PyTorch's machinery, on the GPU: the custom ops pass torch.library.opcheck; eager calls skip
the dispatcher and match the ops bitwise; torch.compile
keeps attention in one graph (forward and backward, static then dynamic shapes) with eager's results; forward and
backward captured in a CUDA graph replay on new inputs with eager's results, both also with the tensors on a second GPU
while the first is current; calls run on the caller's current stream of the tensors' device; explain names the configs and writes their sources; tune sweeps and the process then runs the winner;
shape errors name the caller's dims; empty inputs, meta tensors, torch.use_deterministic_algorithms and
torch.autocast.
"""

import os

import pytest

import testsupport

_missing = testsupport.gpu_missing()
if _missing:
    pytest.skip(f"GPU tests skipped: {_missing}", allow_module_level=True)

import torch  # noqa: E402

import flashgen  # noqa: E402
import flashgen.torch as fgt  # noqa: E402
from flashgen.torch import _autograd as fg_autograd  # noqa: E402


def _randn(*shape, dtype=torch.bfloat16, seed=0, requires_grad=False, device="cuda"):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    t = torch.randn(*shape, device="cuda", generator=generator).to(dtype).to(device)
    return t.requires_grad_() if requires_grad else t


# The device the tensors live on, with device 0 current throughout: "cuda:1" runs only where a second GPU is.
_DEVICES = [pytest.param("cuda:0", id="gpu0"),
            pytest.param("cuda:1", id="gpu1-while-gpu0-current", marks=pytest.mark.skipif(
                torch.cuda.device_count() < 2, reason="one GPU: no second device to put the tensors on"))]


def _close(got, want, dtype):
    """Equal up to one epsilon of dtype at want's scale: the last-bit differences of fp32 atomics' order."""
    allowed = testsupport.EPSILON[str(dtype).replace("torch.", "")] * want.abs().max().item()
    return testsupport.max_error(got, want) <= allowed


def test_opcheck():
    q = _randn(1, 80, 4, 64, dtype=torch.float16, seed=1, requires_grad=True)
    k = _randn(1, 96, 2, 64, dtype=torch.float16, seed=2, requires_grad=True)
    v = _randn(1, 96, 2, 64, dtype=torch.float16, seed=3, requires_grad=True)
    # deterministic: opcheck compares the outputs and gradients of several runs.
    torch.library.opcheck(torch.ops.flashgen.attention_forward.default, (q, k, v, 0.0, "bottom_right", "bshd", True))
    q, k, v = (t.detach() for t in (q, k, v))
    out, lse = torch.ops.flashgen.attention_forward(q, k, v, 0.0, "bottom_right", "bshd", True)
    dout = _randn(*out.shape, dtype=torch.float16, seed=4)
    torch.library.opcheck(torch.ops.flashgen.attention_backward.default,
                          (dout, q, k, v, out, lse, 0.0, "bottom_right", "bshd", True))


def test_eager_calls_skip_the_dispatcher_and_match_the_ops_bitwise():
    # attention() on plain CUDA tensors runs the ops' work through _EagerAttention; the outputs and (deterministic)
    # gradients are those of the custom ops, bit for bit.
    q, k, v = (_randn(2, 200, 4, 64, seed=s, requires_grad=True) for s in (1, 2, 3))
    dout = _randn(2, 200, 4, 64, seed=4)
    assert fg_autograd._eager_call(q, k, v)
    out, lse = fgt.attention(q, k, v, causal=True, deterministic=True, return_lse=True)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    op_out, op_lse = torch.ops.flashgen.attention_forward(q, k, v, 0.0, "bottom_right", "bshd", True)
    op_grads = torch.autograd.grad(op_out, (q, k, v), dout)
    assert torch.equal(out, op_out) and torch.equal(lse, op_lse)
    assert all(torch.equal(g, h) for g, h in zip(grads, op_grads))
    assert out.grad_fn is not None and not lse.requires_grad
    assert not fg_autograd._eager_call(q.to("meta"), k, v)


@pytest.mark.parametrize("device", _DEVICES)
def test_torch_compile_keeps_attention_in_the_graph(device):
    torch._dynamo.reset()
    torch.cuda.set_device(0)

    def loss_of(q, k, v):
        out = fgt.attention(q, k, v, causal=True, deterministic=True)
        return (out.float() ** 2).sum()

    compiled = torch.compile(loss_of, fullgraph=True)  # fullgraph: any graph break is an error
    for seqlen in (128, 200):  # the second length recompiles with dynamic shapes (the fake ops see SymInts)
        q = _randn(2, seqlen, 4, 64, seed=seqlen, requires_grad=True, device=device)
        k = _randn(2, seqlen, 2, 64, seed=seqlen + 1, requires_grad=True, device=device)
        v = _randn(2, seqlen, 2, 64, seed=seqlen + 2, requires_grad=True, device=device)
        loss = compiled(q, k, v)
        assert loss.device == torch.device(device) and torch.cuda.current_device() == 0
        grads = torch.autograd.grad(loss, (q, k, v))
        eager_loss = loss_of(q, k, v)
        eager_grads = torch.autograd.grad(eager_loss, (q, k, v))
        assert torch.allclose(loss, eager_loss, rtol=1e-4)
        for name, got, want in zip(("dq", "dk", "dv"), grads, eager_grads):
            # The same dout reaches the same deterministic kernels: the same bits.
            assert torch.equal(got, want), f"seqlen {seqlen}: compiled {name} differs from eager"


@pytest.mark.parametrize("device", _DEVICES)
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic-dq", "deterministic"])
def test_cuda_graph_capture_and_replay(deterministic, device):
    torch.cuda.set_device(0)
    q = _randn(2, 160, 4, 64, seed=10, requires_grad=True, device=device)
    k = _randn(2, 200, 2, 64, seed=11, requires_grad=True, device=device)
    v = _randn(2, 200, 2, 64, seed=12, requires_grad=True, device=device)
    dout = _randn(2, 160, 4, 64, seed=13, device=device)

    def step():
        out = fgt.attention(q, k, v, causal=True, deterministic=deterministic)
        return (out, *torch.autograd.grad(out, (q, k, v), dout))

    # Warm-up on a side stream, as torch.cuda.graph asks: compiles or loads the kernels before capture. A graph is
    # captured on its device's streams; the eager calls after it run with device 0 current again.
    with torch.cuda.device(device):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                step()
        torch.cuda.current_stream().wait_stream(side)

        # A capture stream of this device: torch.cuda.graph's default one is made once, on the first device used.
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=torch.cuda.Stream()):
            captured = step()

    for seed in (20, 30):
        with torch.no_grad():
            for i, t in enumerate((q, k, v, dout)):
                t.copy_(_randn(*t.shape, seed=seed + i, device=device))
        graph.replay()
        expected = step()
        torch.cuda.synchronize(device)
        for name, got, want in zip(("out", "dq", "dk", "dv"), captured, expected):
            exact = deterministic or name == "out"
            assert torch.equal(got, want) if exact else _close(got, want, torch.bfloat16), \
                f"replay {seed}: {name} differs from eager (max |diff| {testsupport.max_error(got, want):.3g})"


def test_runs_on_the_current_stream():
    q, k, v = (_randn(1, 256, 4, 64, seed=40 + i) for i in range(3))
    expected = fgt.attention(q, k, v, causal=True)
    q_late = torch.zeros_like(q)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        # q_late is written only after ~50 ms of GPU time on this stream: a kernel queued anywhere else would
        # read the zeros.
        torch.cuda._sleep(100_000_000)
        q_late.copy_(q)
        out = fgt.attention(q_late, k, v, causal=True)
    torch.cuda.current_stream().wait_stream(stream)
    assert torch.equal(out, expected)


def test_other_device_than_the_current_one():
    if torch.cuda.device_count() < 2:
        pytest.skip("one GPU: no other device to put the tensors on")
    q, k, v = (_randn(1, 128, 2, 64, seed=50 + i) for i in range(3))
    expected = fgt.attention(q, k, v)
    with torch.cuda.device(0):
        out = fgt.attention(*(t.to("cuda:1") for t in (q, k, v)))
    assert out.device == torch.device("cuda:1")
    assert torch.equal(out.cpu(), expected.cpu())


def test_other_device_runs_on_that_devices_current_stream():
    if torch.cuda.device_count() < 2:
        pytest.skip("one GPU: no other device to put the tensors on")
    q, k, v = (_randn(1, 256, 4, 64, seed=55 + i) for i in range(3))
    expected = fgt.attention(q, k, v, causal=True)
    q1, k1, v1 = (t.to("cuda:1") for t in (q, k, v))
    q_late = torch.zeros_like(q1)
    side = torch.cuda.Stream(device="cuda:1")
    side.wait_stream(torch.cuda.current_stream("cuda:1"))
    with torch.cuda.stream(side):  # device 1's current stream, and device 1 current
        # q_late is written only after ~50 ms of GPU time on device 1's side stream: a call queued on any other
        # stream, of either device, would read the zeros.
        torch.cuda._sleep(100_000_000)
        q_late.copy_(q1)
        with torch.cuda.device(0):
            assert torch.cuda.current_stream("cuda:1") == side
            out = fgt.attention(q_late, k1, v1, causal=True)
    torch.cuda.current_stream("cuda:1").wait_stream(side)
    assert out.device == torch.device("cuda:1")
    assert torch.equal(out.cpu(), expected.cpu())


_SOURCES = {"tuning database", "tuned on first use", "shipped defaults", "heuristic"}


def test_explain_names_the_configs_and_writes_their_sources():
    q = _randn(2, 4, 300, 64, seed=60)  # bhsd
    k, v = _randn(2, 2, 300, 64, seed=61), _randn(2, 2, 300, 64, seed=62)
    info = fgt.explain(q, k, v, causal=True, layout="bhsd")
    assert info["version"] == flashgen.__version__ and os.path.exists(info["library"])
    major, minor = torch.cuda.get_device_capability()
    forward, backward = info["forward"], info["backward"]
    assert forward["pass"] == "forward" and backward["pass"] == "backward"
    assert forward["config"].startswith("fwd_") and "_bf16_d64_" in forward["config"]
    assert "causal" in forward["config"]
    assert forward["source"] in _SOURCES and forward["reason"]
    assert forward["arch"] == backward["arch"] == major * 10 + minor
    if "_pst" in forward["config"]:  # persistent: one block per SM walks the tiles
        assert forward["grid"][0] >= 1 and forward["grid"][1:] == [1, 1]
    else:
        assert forward["grid"][1:] == [4, 2]  # (query blocks, heads_q, batch)
    assert backward["config"].startswith("bwd_") and "_bf16_d64_" in backward["config"]
    assert backward["source"] in _SOURCES and backward["reason"]
    if backward["config"].startswith("bwd_sm90_"):
        # Rows padded to 128 per head; D, the LSE in base 2, the dQ accumulator and two counters per 64 rows.
        rows, floats, slack = 2 * 4 * 384, 66, 768
    else:
        rows, floats, slack = 2 * 4 * 300, 65, 512  # D and the dQ accumulator
    assert 4 * rows * floats <= backward["workspace_bytes"] <= 4 * rows * floats + slack
    assert [kernel["symbol"].rsplit("_", 1)[1] for kernel in backward["kernels"]] == ["preprocess", "dkdv", "convert"]
    for answer in (forward, backward):
        assert answer["source_path"], answer.get("source_path_error")
        with open(answer["source_path"]) as f:
            source = f.read()
        assert answer["config"] in source and 'extern "C"' in source

    deterministic = fgt.explain(q, k, v, causal=True, layout="bhsd", deterministic=True)["backward"]
    assert "_det" in deterministic["config"]
    if deterministic["config"].startswith("bwd_sm90_"):
        # The same kernels and workspace: their dQ adds take turns on the counters the atomic ones count on.
        assert [kernel["symbol"].rsplit("_", 1)[1] for kernel in deterministic["kernels"]] == [
            "preprocess", "dkdv", "convert"]
        assert deterministic["workspace_bytes"] == backward["workspace_bytes"]
    else:
        assert deterministic["workspace_bytes"] < backward["workspace_bytes"]  # the dq kernel: no accumulator
    assert fgt.explain(q, k, v, layout="bhsd", backward=False).keys() == {"library", "version", "forward"}


def test_tune_sweeps_and_the_process_runs_the_winner():
    q, k, v = (_randn(2, 512, 4, 64, dtype=torch.float16, seed=70 + i) for i in range(3))
    result = fgt.tune(q, k, v, causal=True)
    assert result["config"].startswith("fwd_") and "_fp16_d64_" in result["config"]
    assert result["reason"].startswith("tuned on first use: the fastest of 16 candidates"), result["reason"]
    assert result["problem"].startswith("fwd|fp16|d64|causal|g1|")
    assert os.path.exists(result["db"]) and os.path.samefile(result["db"], os.environ["FLASHGEN_TUNING_DB"])

    forward = fgt.explain(q, k, v, causal=True, backward=False)["forward"]
    assert forward["source"] == "tuned on first use" and forward["config"] == result["config"]
    # The winner computes what the built-in choice does, within fp16 rounding of the output.
    out = fgt.attention(q, k, v, causal=True)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel([SDPBackend.MATH]):
        want = torch.nn.functional.scaled_dot_product_attention(
            *(t.transpose(1, 2).double() for t in (q, k, v)), is_causal=True).transpose(1, 2)
    assert testsupport.max_error(out, want) <= 4 * testsupport.EPSILON["float16"] * want.abs().max().item()


def test_shape_errors_name_the_callers_dims():
    q = _randn(1, 6, 16, 64, dtype=torch.float16)  # bhsd: 6 heads
    k = _randn(1, 4, 16, 64, dtype=torch.float16, seed=1)
    with pytest.raises(fgt.FlashgenArgumentError, match=r"q\.shape\[1\] \(heads\) = 6 must be a multiple of "
                                                         r"k\.shape\[1\] \(heads\) = 4"):
        fgt.attention(q, k, k, layout="bhsd")
    # A v of a head dim of its own gives out of that head dim (test_torch_value_dim.py); one no kernel takes is refused.
    assert fgt.attention(q, q, _randn(1, 6, 16, 32, dtype=torch.float16, seed=2), layout="bhsd").shape == (1, 6, 16, 32)
    odd = _randn(1, 6, 16, 100, dtype=torch.float16, seed=2)
    with pytest.raises(fgt.FlashgenArgumentError, match=r"v\.shape\[3\] \(head_dim\) = 100 is unsupported"):
        fgt.attention(q, q, odd, layout="bhsd")
    short = _randn(1, 6, 15, 64, dtype=torch.float16, seed=3)
    with pytest.raises(fgt.FlashgenArgumentError, match=r"v\.shape\[2\] \(seqlen\) is 15 but k\.shape\[2\] "
                                                         r"\(seqlen\) is 16"):
        fgt.attention(q, q, short, layout="bhsd")


def test_empty_inputs_give_empty_or_zero_outputs():
    q = _randn(0, 16, 2, 64, seed=4, requires_grad=True)
    out, lse = fgt.attention(q, q, q, return_lse=True)
    assert out.shape == q.shape and lse.shape == (0, 2, 16)
    # No keys: every row's output is 0, its lse -inf, and the gradients are 0.
    q = _randn(1, 5, 2, 64, seed=5, requires_grad=True)
    k = _randn(1, 0, 2, 64, seed=6, requires_grad=True)
    v = _randn(1, 0, 2, 64, seed=7, requires_grad=True)
    out, lse = fgt.attention(q, k, v, return_lse=True)
    assert out.shape == q.shape and bool((out == 0).all())
    assert lse.shape == (1, 2, 5) and bool(torch.isneginf(lse).all())
    out.float().pow(2).add(out.float()).sum().backward()
    assert q.grad is not None and bool((q.grad == 0).all()) and k.grad.shape == k.shape


def test_meta_tensors_give_the_outputs_shapes():
    q = torch.empty(2, 4, 128, 64, device="meta", dtype=torch.bfloat16)
    k = torch.empty(2, 2, 96, 64, device="meta", dtype=torch.bfloat16)
    out, lse = fgt.attention(q, k, k, layout="bhsd", return_lse=True)
    assert out.device.type == "meta" and out.shape == q.shape
    assert lse.device.type == "meta" and lse.shape == (2, 4, 128) and lse.dtype == torch.float32


def test_use_deterministic_algorithms_picks_the_deterministic_backward():
    q, k, v = (_randn(2, 300, 4, 64, seed=80 + i) for i in range(3))
    assert "_det" not in fgt.explain(q, k, v, causal=True)["backward"]["config"]
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert "_det" in fgt.explain(q, k, v, causal=True)["backward"]["config"]
    finally:
        torch.use_deterministic_algorithms(before)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_autocast_casts_float32_inputs_as_sdpa_does(dtype):
    q, k, v = (_randn(2, 200, 4, 64, dtype=torch.float32, seed=90 + i, requires_grad=True) for i in range(3))
    with pytest.raises(fgt.FlashgenArgumentError, match="float32"):
        fgt.attention(q, k, v)  # outside autocast float32 is refused
    with torch.autocast("cuda", dtype=dtype):
        out = fgt.attention(q, k, v, causal=True)
        want = torch.nn.functional.scaled_dot_product_attention(
            *(t.transpose(1, 2) for t in (q, k, v)), is_causal=True).transpose(1, 2)
    assert out.dtype == dtype and want.dtype == dtype
    eps = testsupport.EPSILON[str(dtype).replace("torch.", "")]
    assert testsupport.max_error(out, want) <= 4 * eps * max(1.0, want.abs().max().item())
    out.float().sum().backward()
    assert q.grad is not None and q.grad.dtype == torch.float32 and bool(torch.isfinite(q.grad).all())
    # The float32 inputs' gradients are those of the cast: the same as through SDPA's.
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    with torch.autocast("cuda", dtype=dtype):
        want = torch.nn.functional.scaled_dot_product_attention(
            *(t.transpose(1, 2) for t in (q, k, v)), is_causal=True).transpose(1, 2)
    want.float().sum().backward()
    for got, t in zip(grads, (q, k, v)):
        assert testsupport.max_error(got, t.grad) <= 8 * eps * max(1.0, t.grad.abs().max().item())
