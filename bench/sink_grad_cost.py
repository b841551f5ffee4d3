"""Backward time of a call with sinks, with their gradient (sinks.requires_grad: the _dsink kernels) and without it,
the same call otherwise; one line per point.

  python3 bench/sink_grad_cost.py > bench/results/sink_grad_cost_<device>_<date>.txt
"""
import torch
import flashgen.torch as fgt
print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, bf16, batch 2, 4096 tokens, 16 heads, median of 15")
for causal in (False, True):
    for d in (64, 128):
        for det in (False, True):
            b, s, hq, hkv = 2, 4096, 16, 16
            g = torch.Generator(device="cuda").manual_seed(7)
            mk = lambda h: torch.randn(b, s, h, d, device="cuda", generator=g, dtype=torch.bfloat16).requires_grad_(True)
            q, k, v = mk(hq), mk(hkv), mk(hkv)
            dout = torch.randn(b, s, hq, d, device="cuda", generator=g, dtype=torch.bfloat16)
            times = {}
            for want in (False, True, False, True):
                sinks = (torch.randn(hq, device="cuda", generator=g) + 1.0).requires_grad_(want)
                out = fgt.attention(q, k, v, causal=causal, sinks=sinks, deterministic=det)
                for _ in range(3):
                    torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
                ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
                ts = []
                for _ in range(15):
                    ev[0].record(); torch.autograd.grad(out, (q, k, v) + ((sinks,) if want else ()), dout, retain_graph=True); ev[1].record()
                    torch.cuda.synchronize(); ts.append(ev[0].elapsed_time(ev[1]))
                ts.sort(); times.setdefault(want, []).append(ts[len(ts)//2])
            a, w = min(times[False]), min(times[True])
            print(f"causal={causal} d={d} det={det}: without {a:.3f} ms  with dsink {w:.3f} ms  ratio {w/a:.3f}", flush=True)
