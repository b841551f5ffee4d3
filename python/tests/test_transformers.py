"""flashgen.transformers.register(): small randomly initialised transformers models (no download) with
attn_implementation="fg_attention" against the same weights on transformers' own attention: logits of a left-padded
batch (unpadded into a packed call), of packed sequences (position_ids restarting at 0) and of a sliding-window
model; greedy generation with the KV cache; a training step's gradients; an unchanged SDPA model running flashgen
under flashgen.torch.enable(). Llama 4 (chunked attention on three layers in four) and gpt-oss (sliding windows,
attention sinks) against SDPA or eager attention in float32: prefill, left- and right-padded batches, packed
sequences, each greedy step's logits with dynamic and static caches, gradients; DeepSeek-V3 (values of a head dim of
their own): a padded batch, greedy steps and gradients. Skips without transformers or a GPU.
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
from flashgen import FlashgenArgumentError  # noqa: E402

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


def test_static_cache_generation_matches_sdpa():
    """cache_implementation="static": key and value hold the whole preallocated cache, its unfilled rows included;
    flashgen attends to the filled ones only and generates SDPA's tokens, with and without left padding."""
    fg_model, sdpa_model = _llama_pair()
    for model in (fg_model, sdpa_model):
        model.lm_head.weight.data *= 40
    generator = torch.Generator(device="cuda").manual_seed(6)
    ids, mask = _left_padded_batch(generator)
    settings = dict(max_new_tokens=12, do_sample=False, pad_token_id=0, cache_implementation="static",
                    disable_compile=True)
    with torch.no_grad():
        for attention_mask in (mask, None):
            prompt = ids if attention_mask is not None else ids.clamp(min=1)
            got = fg_model.generate(input_ids=prompt, attention_mask=attention_mask, **settings)
            want = sdpa_model.generate(input_ids=prompt, attention_mask=attention_mask, **settings)
            assert torch.equal(got, want), f"flashgen generated {got[:, 40:].tolist()}, SDPA {want[:, 40:].tolist()}"


def test_training_step_gradients_match_sdpa():
    fg_model, sdpa_model = _llama_pair()
    generator = torch.Generator(device="cuda").manual_seed(5)
    ids, mask = _left_padded_batch(generator)
    _assert_training_gradients_close(fg_model, sdpa_model, ids, mask, 3e-2)


def _assert_training_gradients_close(fg_model, reference, ids, mask, relative):
    """One training step's parameter gradients of both models on the padded batch, each within relative of the
    reference's norm. Only predictions made from real tokens count: not the padding's, nor the first real token's
    (predicted at a padding position, whose output is the implementation's choice: flashgen's is 0, SDPA's mask
    attends it to every key)."""
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, 1:].masked_fill_(mask[:, :-1] == 0, -100)
    gradients = []
    for model in (fg_model, reference):
        model.train()
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        gradients.append({name: p.grad.float() for name, p in model.named_parameters()})
    for name, want in gradients[1].items():
        got = gradients[0][name]
        error = (got - want).norm().item()
        assert error <= relative * max(want.norm().item(), 1e-6), \
            f"{name}: |got - want| {error:.4g}, |want| {want.norm():.4g}"


# -------------------------------------------------------------------------------------------------------------
# Llama 4 (chunked attention) and gpt-oss (sliding windows, sinks): flashgen in bf16 against transformers' own attention
# in float32 on the same weights.

CHUNK = 64


def _fg_and_reference(config, model_class, reference):
    """(flashgen model in bf16, reference model in float32 on attn_implementation reference): one random
    initialisation on the GPU, its bf16 weights in both."""
    torch.manual_seed(0)
    fg_config, reference_config = copy.deepcopy(config), copy.deepcopy(config)
    fg_config._attn_implementation = NAME
    reference_config._attn_implementation = reference
    fg_model = model_class(fg_config).to(device="cuda", dtype=torch.bfloat16).eval()
    reference_model = model_class(reference_config).to(device="cuda", dtype=torch.float32).eval()
    reference_model.load_state_dict(fg_model.state_dict())
    return fg_model, reference_model


def _llama4_pair(chunk=CHUNK):
    # No MoE layers (moe_layers=[]): a router's top-1 choice could flip between bf16 and float32.
    config = transformers.Llama4TextConfig(
        vocab_size=512, hidden_size=256, intermediate_size=512, intermediate_size_mlp=512, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=1024,
        attention_chunk_size=chunk, moe_layers=[], attention_dropout=0.0, pad_token_id=0, eos_token_id=2)
    assert config.layer_types.count("chunked_attention") == 3, config.layer_types
    return _fg_and_reference(config, transformers.Llama4ForCausalLM, "sdpa")


def _gpt_oss_pair():
    # Two experts, both used by every token: routing weights vary smoothly, no choice can flip.
    config = transformers.GptOssConfig(
        vocab_size=512, hidden_size=256, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, sliding_window=32, num_local_experts=2, num_experts_per_tok=2,
        attention_dropout=0.0, pad_token_id=0, eos_token_id=2)
    # gpt-oss's sinks are served by transformers' eager attention (and flash kernels), not SDPA.
    return _fg_and_reference(config, transformers.GptOssForCausalLM, "eager")


def _padded_batch(generator, length, pads, side):
    """(ids [len(pads), length], mask): row r has pads[r] padding positions on side ("left" or "right")."""
    ids = torch.randint(1, 512, (len(pads), length), device="cuda", generator=generator)
    mask = torch.ones(len(pads), length, dtype=torch.long, device="cuda")
    for row, count in enumerate(pads):
        if count and side == "left":
            mask[row, :count] = 0
        elif count:
            mask[row, length - count:] = 0
    return ids, mask


def _generation_against_reference(fg_model, reference, ids, mask, new, **settings):
    """(flashgen's logits of each greedy step [batch, new, vocab], the reference's for the same tokens): the
    reference runs once over the generated sequence (teacher forcing) with the position_ids generate passed."""
    recorded = []
    hook = fg_model.model.register_forward_pre_hook(
        lambda module, args, kwargs: recorded.append(kwargs.get("position_ids")), with_kwargs=True)
    try:
        out = fg_model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                                do_sample=False, pad_token_id=0, output_logits=True, return_dict_in_generate=True,
                                **settings)
    finally:
        hook.remove()
    assert len(recorded) == new and out.sequences.shape[1] == ids.shape[1] + new
    got = torch.stack(out.logits, dim=1)
    full_mask = torch.cat([mask, mask.new_ones(mask.shape[0], new - 1)], dim=1)
    positions = None
    if recorded[0] is not None:
        positions = torch.cat([p.expand(ids.shape[0], -1) for p in recorded], dim=1)
    want = reference(input_ids=out.sequences[:, :-1], attention_mask=full_mask, position_ids=positions,
                     use_cache=False).logits[:, ids.shape[1] - 1:]
    return got, want


def test_llama4_chunked_prefill_matches_sdpa():
    fg_model, reference = _llama4_pair()
    generator = torch.Generator(device="cuda").manual_seed(11)
    ids = torch.randint(0, 512, (2, 3 * CHUNK + 17), device="cuda", generator=generator)
    fg_transformers.reset_stats()
    with torch.no_grad():
        got = fg_model(input_ids=ids).logits
        want = reference(input_ids=ids).logits
    assert fg_transformers.stats() == {"dense": 4}
    _assert_close("logits", got, want, 3e-2)
    # The chunks matter here: the same weights with one chunk longer than the sequence give other logits.
    unchunked_model, _ = _llama4_pair(chunk=1 << 20)
    unchunked_model.load_state_dict(fg_model.state_dict())
    with torch.no_grad():
        unchunked = unchunked_model(input_ids=ids).logits
    assert (unchunked.float() - want.float()).abs().max().item() > 0.1


@pytest.mark.parametrize("side", ["left", "right"])
def test_llama4_padded_batch_matches_sdpa(side):
    fg_model, reference = _llama4_pair()
    generator = torch.Generator(device="cuda").manual_seed(12)
    # Padding of 13 and of more than a chunk: transformers counts each row's chunks from its first real token.
    ids, mask = _padded_batch(generator, 2 * CHUNK + 40, [0, 13, CHUNK + 9], side)
    fg_transformers.reset_stats()
    with torch.no_grad():
        got = fg_model(input_ids=ids, attention_mask=mask).logits
        want = reference(input_ids=ids, attention_mask=mask).logits
    assert fg_transformers.stats() == {"padded": 4}
    keep = mask.bool()
    _assert_close("logits", got[keep], want[keep], 3e-2)


def test_llama4_packed_sequences_match_sdpa():
    fg_model, reference = _llama4_pair()
    generator = torch.Generator(device="cuda").manual_seed(13)
    # Sequences crossing chunk starts and starting off them. In a packed row transformers counts chunks from the
    # row's start; flashgen takes the runs its mask shows.
    lengths = [CHUNK + 6, 2 * CHUNK + 22, 37]
    ids = torch.randint(0, 512, (1, sum(lengths)), device="cuda", generator=generator)
    positions = torch.cat([torch.arange(n, device="cuda") for n in lengths])[None]
    fg_transformers.reset_stats()
    with torch.no_grad():
        # use_cache=False: transformers finds packed sequences only without a cache (as in training).
        got = fg_model(input_ids=ids, position_ids=positions, use_cache=False).logits
        want = reference(input_ids=ids, position_ids=positions, use_cache=False).logits
    assert fg_transformers.stats() == {"packed": 4}
    _assert_close("logits", got, want, 3e-2)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_llama4_greedy_generation_matches_sdpa(cache):
    """Prompts longer than a chunk and steps across a chunk start (positions 100 to 139 cross 128), where the
    chunked layers' caches hold only the last CHUNK - 1 keys (the static one rolls them); without and with left
    padding."""
    fg_model, reference = _llama4_pair()
    generator = torch.Generator(device="cuda").manual_seed(14)
    settings = {}
    if cache == "static":
        # Eager steps: generate would compile a static cache's steps, which is not what this test checks.
        settings = dict(cache_implementation="static", disable_compile=True)
        _skip_unless_transformers_generates(reference, settings)
    for pads, kind in (([0, 0, 0], "decode"), ([0, 13, CHUNK + 5], "padded")):
        ids, mask = _padded_batch(generator, CHUNK + 36, pads, "left")
        fg_transformers.reset_stats()
        with torch.no_grad():
            got, want = _generation_against_reference(fg_model, reference, ids, mask, 40, **settings)
        _assert_close(f"{cache} cache, pads {pads}: each step's logits", got, want, 3e-2)
        assert fg_transformers.stats().get(kind, 0) > 0, fg_transformers.stats()


def _skip_unless_transformers_generates(reference, settings):
    """Skips when transformers cannot generate with the reference model and these settings itself (a static cache of
    a chunked model fails inside transformers' own mask building in some releases)."""
    ids = torch.randint(1, 512, (1, 8), device="cuda")
    try:
        with torch.no_grad():
            reference.generate(input_ids=ids, max_new_tokens=2, do_sample=False, pad_token_id=0, **settings)
    except (TypeError, ValueError) as error:
        pytest.skip(f"transformers {transformers.__version__} cannot generate {type(reference).__name__} with "
                    f"{settings} itself: {error}")


def test_llama4_training_step_gradients_match_sdpa():
    fg_model, reference = _llama4_pair()
    generator = torch.Generator(device="cuda").manual_seed(15)
    ids, mask = _padded_batch(generator, 2 * CHUNK + 40, [0, 13, CHUNK + 9], "left")
    _assert_training_gradients_close(fg_model, reference, ids, mask, 5e-2)


def test_llama4_refuses_a_prebuilt_4d_mask():
    fg_model, _ = _llama4_pair()
    ids = torch.randint(0, 512, (1, 32), device="cuda")
    mask = torch.ones(1, 1, 32, 32, dtype=torch.bool, device="cuda").tril()
    with torch.no_grad(), pytest.raises(FlashgenArgumentError, match="4-d attention mask"):
        fg_model(input_ids=ids, attention_mask=mask)


def _assert_padded_and_greedy_close(fg_model, reference, seed, padded_length, greedy_length):
    """A left-padded batch of padded_length tokens (each of the two layers' calls packed) against the reference's
    logits, then 12 greedy steps after an unpadded prompt of greedy_length; returns the greedy steps' call counts."""
    generator = torch.Generator(device="cuda").manual_seed(seed)
    ids, mask = _padded_batch(generator, padded_length, [0, 13, 41], "left")
    fg_transformers.reset_stats()
    with torch.no_grad():
        got = fg_model(input_ids=ids, attention_mask=mask).logits
        want = reference(input_ids=ids, attention_mask=mask).logits
    assert fg_transformers.stats() == {"padded": 2}
    keep = mask.bool()
    _assert_close("padded logits", got[keep], want[keep], 3e-2)
    ids, mask = _padded_batch(generator, greedy_length, [0, 0], "left")
    fg_transformers.reset_stats()
    with torch.no_grad():
        got, want = _generation_against_reference(fg_model, reference, ids, mask, 12)
    _assert_close("each step's logits", got, want, 3e-2)
    return fg_transformers.stats()


def test_gpt_oss_window_and_sinks_match_eager():
    fg_model, reference = _gpt_oss_pair()
    # Greedy steps past the window (32) with the sliding layer's cache of 31 keys, on the decode kernels.
    stats = _assert_padded_and_greedy_close(fg_model, reference, 16, 100, 60)
    assert stats.get("decode", 0) > 0, stats


# -------------------------------------------------------------------------------------------------------------
# DeepSeek-V3's multi-head latent attention: queries and keys of 48 columns (32 + 16 rotary), values of 32, which
# transformers hands to the attention function as they are (it pads values only for FlashAttention).

def _deepseek_pair():
    # Dense MLP layers only (first_k_dense_replace covers both layers): no router choice to flip between dtypes.
    config_class = getattr(transformers, "DeepseekV3Config", None)
    if config_class is None:
        pytest.skip(f"transformers {transformers.__version__} has no DeepseekV3Config")
    config = config_class(
        vocab_size=512, hidden_size=256, intermediate_size=512, moe_intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=64, q_lora_rank=None, qk_nope_head_dim=32,
        qk_rope_head_dim=16, v_head_dim=32, first_k_dense_replace=2, n_routed_experts=4, num_experts_per_tok=2,
        n_group=1, topk_group=1, max_position_embeddings=512, attention_dropout=0.0, pad_token_id=0, eos_token_id=2)
    return _fg_and_reference(config, transformers.DeepseekV3ForCausalLM, "sdpa")


def test_deepseek_padded_batch_and_generation_match_sdpa():
    fg_model, reference = _deepseek_pair()
    # Greedy steps: values of their own head dim take the dense path's bottom-right mask, not the decode kernels.
    stats = _assert_padded_and_greedy_close(fg_model, reference, 21, 70, 50)
    assert "decode" not in stats and stats.get("dense", 0) > 0, stats


def test_head_dim_512_padded_batch_and_generation_match_sdpa():
    # Gemma 4's global layers' head dim in a Llama model: the Hopper forward's value split; greedy steps on the dense
    # path (the decode kernels take head dims up to 256).
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("head_dim 512 runs on the Hopper family only")
    config = transformers.LlamaConfig(
        vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=512, max_position_embeddings=512, attention_dropout=0.0, pad_token_id=0,
        eos_token_id=2)
    fg_model, reference = _fg_and_reference(config, transformers.LlamaForCausalLM, "sdpa")
    stats = _assert_padded_and_greedy_close(fg_model, reference, 23, 70, 50)
    assert "decode" not in stats and stats.get("dense", 0) > 0, stats


def test_deepseek_training_step_gradients_match_sdpa():
    fg_model, reference = _deepseek_pair()
    generator = torch.Generator(device="cuda").manual_seed(22)
    ids, mask = _padded_batch(generator, 70, [0, 13, 41], "left")
    _assert_training_gradients_close(fg_model, reference, ids, mask, 5e-2)
