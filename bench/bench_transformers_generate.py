"""Greedy generation of a randomly initialised Llama-shaped transformers model (no download) with
attn_implementation="fg_attention" (flashgen.transformers) against "sdpa" in the same process: the prefill's time
and the time per generated token, CUDA events around model.generate, median of repeats taken in turns.
    FLASHGEN_LIBRARY=build/libflashgen.so PYTHONPATH=python python bench/bench_transformers_generate.py [--csv FILE]
"""
import argparse
import copy
import cProfile
import datetime
import io
import pstats
import statistics

import torch
import transformers

import flashgen
import flashgen.transformers as fg_transformers


def generate_ms(model, ids, new_tokens):
    """Milliseconds of one model.generate(ids) producing new_tokens tokens (greedy, no stopping), CUDA events."""
    settings = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    model.generate(input_ids=ids, **settings)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


def interleaved_medians(models, ids, new_tokens, repeats):
    """{implementation: median ms of generate}, the implementations taking turns in each repeat (after a warm-up
    each: kernels compiled or loaded, allocator filled), so that a drift of the host's speed meets both alike."""
    for model in models.values():
        generate_ms(model, ids, new_tokens)
    samples = {implementation: [] for implementation in models}
    for _ in range(repeats):
        for implementation, model in models.items():
            samples[implementation].append(generate_ms(model, ids, new_tokens))
    return {implementation: statistics.median(times) for implementation, times in samples.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--csv")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--profile", action="store_true",
                        help="also print a cProfile table (by own time) of each implementation's 32-token generation at "
                             "batch 1 x 1k")
    args = parser.parse_args()
    name = fg_transformers.register()
    config = transformers.LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=8,
                                      num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=40000)
    torch.manual_seed(0)
    models = {}
    for implementation in ("sdpa", name):
        own = copy.deepcopy(config)
        own._attn_implementation = implementation
        model = transformers.LlamaForCausalLM(own).to(device="cuda", dtype=torch.bfloat16).eval()
        if models:
            model.load_state_dict(next(iter(models.values())).state_dict())
        models[implementation] = model
    lines = ["device,date,torch,transformers,flashgen,batch,prompt,implementation,prefill_ms,per_token_ms"]
    print(lines[0], flush=True)
    with torch.no_grad():
        for batch, prompt in ((1, 1024), (1, 16384), (8, 4096)):
            ids = torch.randint(1, 32000, (batch, prompt), device="cuda")
            prefill = interleaved_medians(models, ids, 1, args.repeats)
            total = interleaved_medians(models, ids, 65, args.repeats)
            for implementation in models:
                per_token = (total[implementation] - prefill[implementation]) / 64
                lines.append(f"{torch.cuda.get_device_name()},{datetime.date.today().isoformat()},{torch.__version__},"
                             f"{transformers.__version__},{flashgen.version()},{batch},{prompt},{implementation},"
                             f"{prefill[implementation]:.2f},{per_token:.3f}")
                print(lines[-1], flush=True)  # the header and every row, as they come
        if args.profile:
            ids = torch.randint(1, 32000, (1, 1024), device="cuda")
            for implementation, model in models.items():
                profiler = cProfile.Profile()
                profiler.enable()
                generate_ms(model, ids, 33)
                profiler.disable()
                text = io.StringIO()
                pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(18)
                print(f"# profile of {implementation}\n" + text.getvalue(), flush=True)
    if args.csv:
        with open(args.csv, "w") as out:
            out.writelines(line + "\n" for line in lines)


if __name__ == "__main__":
    main()
