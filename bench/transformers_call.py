"""Host time of one layer's attention call in a generation step, as transformers makes it: flashgen.transformers'
attention function (with the mask its mask function returns for the step) against transformers' SDPA one (its mask
for the step: none without padding), in the same process. Decode steps (one new query, no padding) of a Llama-shaped
layer (32 query heads, 8 key/value heads of 128) against caches of 1k, 4k and 16k keys at batch 1 and 8, the cache
as DynamicCache hands it over ([batch, heads, keys, head_dim]): "fixed", one cache for every call, and "growing", the
key count one more at each call (cycling over 64 lengths) as in generation, where the cache's shape changes at every
step. Median of back-to-back calls, the two implementations taking turns in rounds; random inputs.
    FLASHGEN_LIBRARY=build/libflashgen.so PYTHONPATH=python python bench/transformers_call.py [--csv FILE] [--profile]
"""
import argparse
import cProfile
import datetime
import io
import pstats
import statistics
import time
import types

import torch
import transformers
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import causal_mask_function

import flashgen
import flashgen.transformers as fg_transformers


def interleaved_us(calls, count, rounds=10):
    """{name: median host µs per call} of each call run count times back to back, the calls taking turns in rounds
    of count / rounds (this host's speed drifts between seconds), the stream drained between runs (untimed)."""
    samples = {name: [] for name in calls}
    for call in calls.values():
        call()
    for _ in range(rounds):
        for name, call in calls.items():
            torch.cuda.synchronize()
            for _ in range(count // rounds):
                start = time.perf_counter_ns()
                call()
                samples[name].append((time.perf_counter_ns() - start) / 1e3)
    torch.cuda.synchronize()
    return {name: statistics.median(times) for name, times in samples.items()}


def breakdown(module, calls):
    """Where one decode call's host time goes (batch 8, 4k keys, fixed cache), layer by layer, each run alone."""
    from flashgen.torch import _calls, _kvcache, _kvcache_calls
    q = torch.randn(8, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(8, 8, 4096, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    mask = fg_transformers.padding_mask(8, 1, 4096, q_offset=4095, kv_offset=0, mask_function=causal_mask_function,
                                        attention_mask=torch.ones(8, 4096, dtype=torch.long, device="cuda"),
                                        device=q.device)
    fg_transformers.attention_forward(module, q, k, v, mask, scaling=128 ** -0.5)
    plan = next(iter(_calls._plans.kvcache.values()))
    stream = _calls._stream_handle(q.device)
    layers = {
        "fg transformers.attention_forward": lambda: fg_transformers.attention_forward(module, q, k, v, mask,
                                                                                       scaling=128 ** -0.5),
        "fg decode_step": lambda: _kvcache.decode_step(q, k, v, 128 ** -0.5, True, (-1, -1), 0.0, None, 0),
        "fg _planned_kvcache": lambda: _kvcache_calls._planned_kvcache(
            q, k, v, None, None, None, None, 128 ** -0.5, "bottom_right", 0, (-1, -1), None, 0, 0.0, None,
            create=False, want_lse=False, layout="bhsd"),
        "fg C call alone": lambda: plan.call(plan.args_ref, stream),
        "q.new_empty(out)": lambda: q.new_empty(plan.out_shape),
        "torch.empty(out)": lambda: torch.empty(plan.out_shape, dtype=q.dtype, device=q.device),
        "sdpa transformers": lambda: sdpa_attention_forward(module, q, k, v, None, scaling=128 ** -0.5),
        "sdpa F.scaled_dot_product_attention": lambda: torch.nn.functional.scaled_dot_product_attention(
            q, k, v, scale=128 ** -0.5, enable_gqa=True),
    }
    with torch.no_grad():
        for name, us in interleaved_us(layers, calls).items():
            print(f"# breakdown {name}: {us:.1f} us", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--csv")
    parser.add_argument("--profile", action="store_true", help="print a cProfile table of flashgen's calls")
    parser.add_argument("--breakdown", action="store_true", help="only time the layers of one decode call")
    args = parser.parse_args()
    config = transformers.LlamaConfig(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8)
    module = types.SimpleNamespace(is_causal=True, config=config, layer_idx=0, training=False,
                                   num_key_value_groups=4)
    if args.breakdown:
        breakdown(module, args.calls)
        return
    lines = ["device,date,torch,transformers,flashgen,batch,keys,cache,implementation,host_us"]
    print(lines[0], flush=True)
    for batch in (1, 8):
        for keys in (1024, 4096, 16384):
            q = torch.randn(batch, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
            k_rows, v_rows = (torch.randn(batch, 8, keys, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            lengths = range(keys - 63, keys + 1)
            masks = {n: fg_transformers.padding_mask(batch, 1, n, q_offset=n - 1, kv_offset=0,
                                                     mask_function=causal_mask_function,
                                                     attention_mask=torch.ones(batch, n, dtype=torch.long,
                                                                               device="cuda"),
                                                     device=q.device) for n in lengths}
            for cache in ("fixed", "growing"):
                steps = [keys] if cache == "fixed" else list(lengths)
                views = [(k_rows[:, :, :n], v_rows[:, :, :n], masks[n]) for n in steps]
                turn = iter(range(1 << 62))

                def step():
                    return views[next(turn) % len(views)]

                def fg_call():
                    k, v, mask = step()
                    return fg_transformers.attention_forward(module, q, k, v, mask, scaling=128 ** -0.5)

                def sdpa_call():
                    k, v, _ = step()
                    return sdpa_attention_forward(module, q, k, v, None, scaling=128 ** -0.5)

                calls = {"fg_attention": fg_call, "sdpa": sdpa_call}
                with torch.no_grad():
                    for name, us in interleaved_us(calls, args.calls).items():
                        lines.append(f"{torch.cuda.get_device_name()},{datetime.date.today().isoformat()},"
                                     f"{torch.__version__},{transformers.__version__},{flashgen.version()},{batch},"
                                     f"{keys},{cache},{name},{us:.1f}")
                        print(lines[-1], flush=True)
                    if args.profile and batch == 8 and keys == 4096:
                        profiler = cProfile.Profile()
                        profiler.enable()
                        for _ in range(500):
                            fg_call()
                        profiler.disable()
                        text = io.StringIO()
                        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
                        print(text.getvalue())
    if args.csv:
        with open(args.csv, "w") as out:
            out.writelines(line + "\n" for line in lines)


if __name__ == "__main__":
    main()
