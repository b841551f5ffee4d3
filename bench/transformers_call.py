"""Host time of one layer's attention call in a generation step, as transformers makes it: flashgen.transformers'
attention function (with the mask its mask function returns for the step) against transformers' SDPA one (its mask
for the step: none without padding), in the same process. Decode steps (one new query, no padding) of a Llama-shaped
layer (32 query heads, 8 key/value heads of 128) against caches of 1k, 4k and 16k keys at batch 1 and 8, the cache
as DynamicCache hands it over ([batch, heads, keys, head_dim], contiguous). Median of back-to-back calls, the stream
drained every 200 calls; random inputs.
    FLASHGEN_LIBRARY=build/libflashgen.so PYTHONPATH=python python bench/transformers_call.py [--csv FILE] [--profile]
"""
import argparse
import cProfile
import datetime
import io
import pstats
import types

import torch
import transformers
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import causal_mask_function

import flashgen
import flashgen.transformers as fg_transformers
from host_breakdown import per_call_us  # this folder's: the median of back-to-back calls


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--csv")
    parser.add_argument("--profile", action="store_true", help="print a cProfile table of flashgen's calls")
    args = parser.parse_args()
    config = transformers.LlamaConfig(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8)
    module = types.SimpleNamespace(is_causal=True, config=config, layer_idx=0, training=False,
                                   num_key_value_groups=4)
    lines = ["device,date,torch,transformers,flashgen,batch,keys,implementation,host_us"]
    print(lines[0], flush=True)
    for batch in (1, 8):
        for keys in (1024, 4096, 16384):
            q = torch.randn(batch, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
            k, v = (torch.randn(batch, 8, keys, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            padding = torch.ones(batch, keys, dtype=torch.long, device="cuda")
            mask = fg_transformers.padding_mask(batch, 1, keys, q_offset=keys - 1, kv_offset=0,
                                                mask_function=causal_mask_function, attention_mask=padding,
                                                device=q.device)
            calls = {
                "fg_attention": lambda: fg_transformers.attention_forward(module, q, k, v, mask, scaling=128 ** -0.5),
                "sdpa": lambda: sdpa_attention_forward(module, q, k, v, None, scaling=128 ** -0.5),
            }
            with torch.no_grad():
                for name, call in calls.items():
                    us = per_call_us(call, args.calls)
                    lines.append(f"{torch.cuda.get_device_name()},{datetime.date.today().isoformat()},"
                                 f"{torch.__version__},{transformers.__version__},{flashgen.version()},{batch},{keys},"
                                 f"{name},{us:.1f}")
                    print(lines[-1], flush=True)
                if args.profile and batch == 8 and keys == 4096:
                    profiler = cProfile.Profile()
                    profiler.enable()
                    for _ in range(500):
                        calls["fg_attention"]()
                    profiler.disable()
                    text = io.StringIO()
                    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(20)
                    print(text.getvalue())
    if args.csv:
        with open(args.csv, "w") as out:
            out.writelines(line + "\n" for line in lines)


if __name__ == "__main__":
    main()
