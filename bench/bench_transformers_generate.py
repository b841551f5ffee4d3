"""Greedy generation of a randomly initialised Llama-shaped transformers model (no download) with
attn_implementation="fg_attention" (flashgen.transformers) against "sdpa" in the same process: the prefill's time
and the time per decode step, from CUDA events recorded before model.generate and after each token it generates
(a stopping criterion that never stops); the implementations take turns in rounds, and each round's ratio of their
step times is read against SDPA's (median and quartiles over the rounds).
    FLASHGEN_LIBRARY=build/libflashgen.so PYTHONPATH=python python bench/bench_transformers_generate.py [--csv FILE]
        [--rounds N] [--cpu CORE]
"""
import argparse
import copy
import cProfile
import datetime
import gc
import io
import os
import pstats
import statistics

import torch
import transformers

import flashgen
import flashgen.transformers as fg_transformers


class _StepEvents(transformers.StoppingCriteria):
    """A stopping criterion that never stops and records a CUDA event after each generated token: the first after
    the prefill (and its token), the rest one decode step apart."""

    def __init__(self, batch, device):
        self.events = []
        self.going = torch.zeros(batch, dtype=torch.bool, device=device)

    def __call__(self, input_ids, scores, **kwargs):
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        self.events.append(event)
        return self.going


def generate_ms(model, ids, new_tokens):
    """(prefill ms, ms per decode step) of one model.generate(ids) producing new_tokens tokens (greedy, no stopping):
    CUDA events before the call and after each token, so both come from the same call."""
    settings = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    steps = _StepEvents(ids.shape[0], ids.device)
    gc.collect()
    start = torch.cuda.Event(enable_timing=True)
    start.record()
    model.generate(input_ids=ids, stopping_criteria=transformers.StoppingCriteriaList([steps]), **settings)
    torch.cuda.synchronize()
    first, last = steps.events[0], steps.events[-1]
    return start.elapsed_time(first), first.elapsed_time(last) / (len(steps.events) - 1)


def interleaved(models, ids, new_tokens, rounds):
    """{implementation: [(prefill ms, ms per step) of each round]}, the implementations taking turns in each round
    (their order reversed every other round) after a warm-up each (kernels compiled or loaded, allocator filled), so
    that a drift of the host's speed meets both alike and each round pairs two neighbouring runs."""
    for model in models.values():
        generate_ms(model, ids, new_tokens)
    samples = {implementation: [] for implementation in models}
    order = list(models)
    for _ in range(rounds):
        for implementation in order:
            samples[implementation].append(generate_ms(models[implementation], ids, new_tokens))
        order.reverse()
    return samples


def quartiles(values):
    """(first quartile, median, third quartile)."""
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, median, q3


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--csv")
    parser.add_argument("--rounds", type=int, default=25, help="generations of each implementation, in turns")
    parser.add_argument("--new-tokens", type=int, default=65, help="tokens each generation produces")
    parser.add_argument("--cpu", type=int, help="run this process on this CPU core only (less scheduling noise)")
    parser.add_argument("--profile", action="store_true",
                        help="also print a cProfile table (by own time) of each implementation's 32-token "
                             "generation at batch 1 x 1k")
    args = parser.parse_args()
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
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
    lines = ["device,date,torch,transformers,flashgen,batch,prompt,implementation,rounds,prefill_ms,per_token_ms,"
             "per_token_q1,per_token_q3,per_token_vs_sdpa,vs_sdpa_q1,vs_sdpa_q3"]
    print(lines[0], flush=True)
    with torch.no_grad():
        for batch, prompt in ((1, 1024), (1, 16384), (8, 4096)):
            ids = torch.randint(1, 32000, (batch, prompt), device="cuda")
            samples = interleaved(models, ids, args.new_tokens, args.rounds)
            sdpa_steps = [step for _, step in samples["sdpa"]]
            for implementation, runs in samples.items():
                steps = [step for _, step in runs]
                q1, median, q3 = quartiles(steps)
                # Each round's two runs were neighbours: their ratio cancels the host's drift between rounds.
                r1, ratio, r3 = quartiles([step / sdpa for step, sdpa in zip(steps, sdpa_steps)])
                prefill = statistics.median(first for first, _ in runs)
                lines.append(f"{torch.cuda.get_device_name()},{datetime.date.today().isoformat()},{torch.__version__},"
                             f"{transformers.__version__},{flashgen.version()},{batch},{prompt},{implementation},"
                             f"{args.rounds},{prefill:.2f},{median:.3f},{q1:.3f},{q3:.3f},{ratio:.4f},{r1:.4f},"
                             f"{r3:.4f}")
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
