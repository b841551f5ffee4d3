"""flashgen.transformers.register(): small randomly initialised transformers models (no download) with
attn_implementation="fg_attention" against the same weights on transformers' SDPA path: logits of a left-padded
batch (unpadded into a packed call), of packed sequences (position_ids restarting at 0) and of a sliding-window
model; greedy generation with the KV cache; a training step's gradients. Also an unchanged SDPA model running
flashgen under flashgen.torch.enable(). Skips without transformers or a GPU.
"""

import copy

import pytest

import testsupport

_missing = testsupport.gpu_missing()
if _missing:
    pytest.skip(f"GPU tests skipped: {_missing}", allow_module_level=True)
transformers = pytest.importorskip("transformers")

import torch  # noqa: E402

import flashgen.transformers as fg_transformers  # noqa: E402

NAME = fg_transformers.register()


def _pair(config_class, model_class, **fields):
    """(flashgen model, SDPA model): one random initialisation in bf16 on the GPU, the same weights in both."""
    config = config_class(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                          attention_dropout=0.0, **fields)
    torch.manual_seed(0)
    models = []
    for implementation in (NAME, "sdpa"):
        own = copy.deepcopy(config)
        own._attn_implementation = implementation
        model = model_class(own).to(device="cuda", dtype=torch.bfloat16)
        if models:
            model.load_state_dict(models[0].state_dict())
        models.append(model.eval())
    return models


def _llama_pair():
    return _pair(transformers.LlamaConfig, transformers.LlamaForCausalLM)


def _assert_close(name, got, want, relative):
    error = (got.float() - want.float()).abs().max().item()
    scale = want.float().abs().max().item()
    assert error <= relative * max(scale, 1.0), f"{name}: max error {error:.4g} against max |want| {scale:.4g}"


def _left_padded_batch(generator):
    ids = torch.randint(0, 512, (3, 40), device="cuda", generator=generator)
    mask = torch.ones(3, 40, dtype=torch.long, device="cuda")
    mask[1, :13] = 0
    mask[2, :31] = 0
    return ids, mask


def test_model_loads_under_the_name():
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=NAME)
    assert model.config._attn_implementation == NAME
    with pytest.raises(ValueError, match="flash"):
        fg_transformers.register("flashgen")


def test_padded_batch_logits_match_sdpa_with_no_fallback():
    fg_model, sdpa_model = _llama_pair()
    generator = torch.Generator(device="cuda").manual_seed(1)
    ids, mask = _left_padded_batch(generator)
    fg_transformers.reset_stats()
    with torch.no_grad():
        got = fg_model(input_ids=ids, attention_mask=mask).logits
        want = sdpa_model(input_ids=ids, attention_mask=mask).logits
    assert fg_transformers.stats() == {"padded": 2}  # each layer's call went packed
    keep = mask.bool()
    _assert_close("logits", got[keep], want[keep], 2e-2)


def test_packed_sequences_match_each_sequence_alone():
    fg_model, sdpa_model = _llama_pair()
    generator = torch.Generator(device="cuda").manual_seed(2)
    lengths = [17, 40, 3]
    ids = torch.randint(0, 512, (1, sum(lengths)), device="cuda", generator=generator)
    positions = torch.cat([torch.arange(n, device="cuda") for n in lengths])[None]
    fg_transformers.reset_stats()
    with torch.no_grad():
        got = fg_model(input_ids=ids, position_ids=positions).logits
        start = 0
        for n in lengths:
            want = sdpa_model(input_ids=ids[:, start:start + n]).logits
            _assert_close(f"logits of the sequence at {start}", got[:, start:start + n], want, 2e-2)
            start += n
    assert fg_transformers.stats() == {"packed": 2}


def test_sliding_window_logits_match_sdpa():
    fg_model, sdpa_model = _pair(transformers.MistralConfig, transformers.MistralForCausalLM, sliding_window=16)
    generator = torch.Generator(device="cuda").manual_seed(3)
    ids = torch.randint(0, 512, (2, 100), device="cuda", generator=generator)
    with torch.no_grad():
        got = fg_model(input_ids=ids).logits
        want = sdpa_model(input_ids=ids).logits
        # The window matters here: without it the logits differ.
        fg_model.config.sliding_window = None
        unwindowed = fg_model(input_ids=ids).logits
    _assert_close("logits", got, want, 2e-2)
    assert (unwindowed.float() - want.float()).abs().max().item() > 0.1


def test_an_unchanged_sdpa_model_runs_flashgen_once_enabled():
    import flashgen.torch as fgt
    _, sdpa_model = _llama_pair()
    generator = torch.Generator(device="cuda").manual_seed(6)
    ids = torch.randint(0, 512, (2, 64), device="cuda", generator=generator)
    with torch.no_grad():
        want = sdpa_model(input_ids=ids).logits
        with fgt.enable():
            fgt.reset_sdpa_stats()
            got = sdpa_model(input_ids=ids).logits
            stats = fgt.sdpa_stats()
    assert stats["forward"] == {"flashgen": 2}, stats  # both layers' SDPA calls (causal, grouped heads)
    _assert_close("logits", got, want, 2e-2)


def test_greedy_generation_with_the_kv_cache_matches_sdpa():
    fg_model, sdpa_model = _llama_pair()
    # A peaked output layer: the greedy choices are far from ties, so bf16 rounding cannot flip one.
    for model in (fg_model, sdpa_model):
        model.lm_head.weight.data *= 40
    generator = torch.Generator(device="cuda").manual_seed(4)
    ids, mask = _left_padded_batch(generator)
    settings = dict(max_new_tokens=12, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        got = fg_model.generate(input_ids=ids, attention_mask=mask, **settings)
        want = sdpa_model.generate(input_ids=ids, attention_mask=mask, **settings)
        assert torch.equal(got, want), f"flashgen generated {got[:, 40:].tolist()}, SDPA {want[:, 40:].tolist()}"
        # Without padding the steps after the prefill run the decode kernels.
        fg_transformers.reset_stats()
        ids = ids.clamp(min=1)  # no pad token (0) left for generate to take for padding
        got = fg_model.generate(input_ids=ids, **settings)
        want = sdpa_model.generate(input_ids=ids, **settings)
        assert torch.equal(got, want), f"flashgen generated {got[:, 40:].tolist()}, SDPA {want[:, 40:].tolist()}"
    assert fg_transformers.stats() == {"dense": 2, "decode": 2 * 11}


def test_training_step_gradients_match_sdpa():
    fg_model, sdpa_model = _llama_pair()
    generator = torch.Generator(device="cuda").manual_seed(5)
    ids, mask = _left_padded_batch(generator)
    # Only predictions made from real tokens count: not the padding's, nor the first real token's (predicted at a
    # padding position, whose output is the implementation's choice: flashgen's is 0, SDPA's mask attends it to
    # every key).
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, 1:].masked_fill_(mask[:, :-1] == 0, -100)
    gradients = []
    for model in (fg_model, sdpa_model):
        model.train()
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        gradients.append({name: p.grad.float() for name, p in model.named_parameters()})
    for name, want in gradients[1].items():
        got = gradients[0][name]
        error = (got - want).norm().item()
        assert error <= 3e-2 * max(want.norm().item(), 1e-6), f"{name}: |got - want| {error:.4g}, |want| {want.norm():.4g}"
