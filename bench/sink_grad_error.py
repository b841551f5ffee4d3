"""Where the sinks' gradient's error comes from: flashgen's dsinks of packed causal and unmasked batches (with and
without sequences of no key) and of one long sequence, against a float64 reference, beside the same formula
-Σ_rows exp(sink - lse) · rowsum(dO ∘ out) evaluated in float64 on flashgen's own out and lse (how far the sinks'
kernel is from exact), on the float64 out rounded to the inputs' dtype (what rounding out alone costs), and a
PyTorch implementation in fp32 whose gradient never reads a rounded out. Prints a line per case.
    FLASHGEN_LIBRARY=build/libflashgen.so PYTHONPATH=python:python/tests python bench/sink_grad_error.py
"""
import datetime

import torch

import flashgen.torch as fgt
import testsupport
from test_torch_sinks import _sink_reference


def fp32_autograd_dsinks(q, k, v, dout, scale, visible, sinks):
    """dsinks of an fp32 implementation (softmax over the scores and the sink, out rounded to q's dtype last)."""
    qf, kf, vf = (t.detach().float() for t in (q, k, v))
    s = sinks.detach().float().requires_grad_(True)
    group = q.shape[2] // k.shape[2]
    kr, vr = (t.repeat_interleave(group, dim=2) for t in (kf, vf))
    scores = (torch.einsum("bqhd,bkhd->bhqk", qf, kr) * scale).masked_fill(~visible, float("-inf"))
    logits = torch.cat([scores, s[None, :, None, None].expand(*scores.shape[:3], 1)], dim=-1)
    out = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(logits, dim=-1)[..., :-1], vr).to(q.dtype)
    out.backward(dout)
    return s.grad.double()


def case(label, q_lens, k_lens, dtype, causal, seed, heads_q=8, heads_kv=2, head_dim=64):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(sum(lens), heads, head_dim, device="cuda", generator=generator).to(dtype)
               .requires_grad_(True) for lens, heads in ((q_lens, heads_q), (k_lens, heads_kv), (k_lens, heads_kv)))
    dout = torch.randn(sum(q_lens), heads_q, head_dim, device="cuda", generator=generator).to(dtype)
    sinks = (torch.randn(heads_q, device="cuda", generator=generator) + 2.0).requires_grad_(True)
    scale = head_dim ** -0.5
    out, lse, _ = fgt.varlen_attention(q, k, v, testsupport.packed_offsets(q_lens), testsupport.packed_offsets(k_lens),
                                       max(q_lens), max(k_lens), causal=causal, sinks=sinks, softmax_scale=scale,
                                       return_attn_probs=True)
    out.backward(dout)
    sink64 = sinks.detach().double()
    want, own, rounded, fp32 = (torch.zeros(heads_q, dtype=torch.float64, device="cuda") for _ in range(4))
    q0 = k0 = 0
    for sq, sk in zip(q_lens, k_lens):
        rows, keys = slice(q0, q0 + sq), slice(k0, k0 + sk)
        visible = testsupport.visible_keys(sq, sk, "bottom_right" if causal else "none", q.device)
        out64, lse64, grads = _sink_reference(q[None, rows], k[None, keys], v[None, keys], dout[None, rows], scale,
                                              visible, sinks)
        want += grads[3]
        d_row = dout[rows].double()
        own -= (torch.exp(sink64 - lse[:, rows].double().T) * (d_row * out[rows].detach().double()).sum(-1)).sum(0)
        rounded -= (torch.exp(sink64 - lse64[0].T) * (d_row * out64[0].to(dtype).double()).sum(-1)).sum(0)
        fp32 += fp32_autograd_dsinks(q[None, rows], k[None, keys], v[None, keys], dout[None, rows], scale, visible,
                                     sinks)
        q0, k0 = q0 + sq, k0 + sk
    got = sinks.grad.double()

    def error(x):
        return (x - want).abs().max().item()

    print(f"{label}: max |dsinks| {want.abs().max().item():.3e}; error of flashgen {error(got):.2e}, of the formula "
          f"on flashgen's out and lse {error(own):.2e} (from flashgen {(got - own).abs().max().item():.2e}), on the "
          f"reference's out rounded {error(rounded):.2e}, of fp32 autograd {error(fp32):.2e}", flush=True)


def main():
    print(f"# {torch.cuda.get_device_name()}, {datetime.date.today().isoformat()}, torch {torch.__version__}; "
          "8 query heads over 2 kv heads of 64, sinks ~ N(2, 1)")
    queries = [250 + 7 * i for i in range(9)]
    keys = [240 + 5 * i for i in range(9)]
    no_keys = [0 if i % 3 == 1 else n for i, n in enumerate(keys)]
    for seed in (1, 2, 3):
        for dtype in (torch.float16, torch.bfloat16):
            name = str(dtype).removeprefix("torch.")
            for causal in (True, False):
                mask = "causal" if causal else "no mask"
                case(f"seed {seed} {name} {mask}, 9 sequences, 3 with no key", queries, no_keys, dtype, causal, seed)
                case(f"seed {seed} {name} {mask}, 9 sequences", queries, keys, dtype, causal, seed)
            case(f"seed {seed} {name} no mask, one sequence of 2048", [2048], [2048], dtype, False, seed)


if __name__ == "__main__":
    main()
