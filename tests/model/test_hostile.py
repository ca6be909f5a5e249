"""Hostile inputs not already covered in tests/model/test_binding.py (wrong target, missing/unexpected/
truncated weights, pickle-only folder, mask = EOS, γ in the config) and tests/decoding/test_candidate.py (beam search,
batch > 1, padding, cache_implementation="static", prompt + max_new_tokens past the context, NaN logits):
each is a named error, or, where transformers' own behaviour is fine, exact."""

import json
import pickle

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import DynamicCache, StaticCache

from hf_dspark import DSparkConfig, DSparkDrafter
from tests.conftest import tiny_target
from tests.helpers import PROMPT, drafter_for, oracle_drafts


def saved(model, tmp_path, **kw):
    drafter_for(model, **kw).save_pretrained(tmp_path)
    return tmp_path


# ---- drafter for another target: the tokenizer -----------------------------------------------------------


def test_assistant_tokenizer_is_refused(llama, char_tokenizer):
    """A DSpark drafter reads the target's token ids (its embedding and LM head are the target's), so a second
    tokenizer can only mean a mismatch; a different vocabulary size is refused at bind (tests/model/test_binding.py)."""
    drafter = drafter_for(llama)
    with pytest.raises(ValueError, match="share the target's tokenizer"):
        llama.generate(PROMPT, max_new_tokens=5, assistant_model=drafter, tokenizer=char_tokenizer,
                       assistant_tokenizer=char_tokenizer)


# ---- corrupted checkpoints -----------------------------------------------------------------------------


def test_non_finite_weights_are_refused(llama, tmp_path):
    path = saved(llama, tmp_path)
    weights = load_file(path / "model.safetensors")
    weights["fc.weight"][0, 0] = float("nan")
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="non-finite"):
        DSparkDrafter.from_pretrained(path, target=llama)


@pytest.mark.parametrize("damage", ["garbage header", "empty file", "flipped header length"])
def test_damaged_safetensors_are_named(llama, tmp_path, damage):
    path = saved(llama, tmp_path)
    f = path / "model.safetensors"
    raw = bytearray(f.read_bytes())
    if damage == "garbage header":
        raw[8:40] = b"\xff" * 32
    elif damage == "empty file":
        raw = bytearray()
    else:  # the 8-byte little-endian header length now points far past the end of the file
        raw[0:8] = (len(raw) * 10).to_bytes(8, "little")
    f.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="could not load"):
        DSparkDrafter.from_pretrained(path, target=llama)


class _Tripwire:
    """Unpickling this creates a file: proof that a pickle was executed."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


@pytest.mark.parametrize("with_safetensors", [False, True])
def test_pickle_checkpoints_are_never_unpickled(llama, tmp_path, with_safetensors):
    marker = tmp_path / "unpickled"
    folder = tmp_path / "ckpt"
    drafter = drafter_for(llama)
    if with_safetensors:
        drafter.save_pretrained(folder)
    else:
        drafter.config.save_pretrained(folder)
    for name in ("pytorch_model.bin", "model.pt", "weights.pkl"):
        (folder / name).write_bytes(pickle.dumps({"fc.weight": _Tripwire(marker)}))
    if with_safetensors:  # safetensors wins; the pickles beside it are never opened
        again = DSparkDrafter.from_pretrained(folder, target=llama)
        assert torch.equal(again.fc.weight, drafter.fc.weight)
    else:
        with pytest.raises(ValueError, match="safetensors only"):
            DSparkDrafter.from_pretrained(folder, target=llama)
    assert not marker.exists()


# ---- mask token --------------------------------------------------------------------------------------


def test_mask_token_equal_to_pad_or_any_eos_is_refused():
    model = tiny_target()
    model.generation_config.pad_token_id = 9
    with pytest.raises(ValueError, match="EOS or PAD"):
        drafter_for(model, mask_token_id=9)
    model = tiny_target()
    model.generation_config.eos_token_id = [7, 12]  # a list of EOS ids: every one counts
    with pytest.raises(ValueError, match="EOS or PAD"):
        drafter_for(model, mask_token_id=12)
    for bad in (-1, 64):
        with pytest.raises(ValueError, match="outside the vocabulary"):
            drafter_for(model, mask_token_id=bad)


def test_checkpoint_whose_mask_token_is_the_targets_eos(tmp_path):
    path = saved(tiny_target(), tmp_path)
    cfg = json.loads((path / "config.json").read_text())
    eos_target = tiny_target(eos=cfg["mask_token_id"])
    with pytest.raises(ValueError, match="EOS or PAD"):
        DSparkDrafter.from_pretrained(path, target=eos_target)


# ---- γ ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("gamma", [0, -3, 65, 10**6, 7.0, True, "7", None])
def test_absurd_block_sizes_are_named(gamma):
    with pytest.raises(ValueError, match="block_size"):
        DSparkConfig(block_size=gamma, target_layer_ids=[0], mask_token_id=1)


@pytest.mark.parametrize("gamma", [0, 1000])
def test_absurd_block_size_in_a_checkpoint(llama, tmp_path, gamma):
    path = saved(llama, tmp_path)
    cfg = json.loads((path / "config.json").read_text())
    cfg["block_size"] = gamma
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="block_size"):
        DSparkDrafter.from_pretrained(path, target=llama)


@pytest.mark.parametrize("gamma", [0, 100])
def test_block_size_edited_after_building_is_named_at_generate(llama, gamma):
    drafter = drafter_for(llama)
    drafter.config.block_size = gamma
    with pytest.raises(ValueError, match="block_size"):
        llama.generate(PROMPT, max_new_tokens=20, assistant_model=drafter)


# ---- caches -------------------------------------------------------------------------------------------


def test_prefilled_cache_is_refused(llama):
    """transformers 5.24's assisted loop re-feeds the prompt on top of a pre-filled cache (its own prompt lookup
    and assistant models then return wrong tokens): DSpark names it instead of losing identity."""
    drafter = drafter_for(llama)
    cache = DynamicCache(config=llama.config)
    with torch.no_grad():
        llama(PROMPT[:, :-1], past_key_values=cache)
    with pytest.raises(NotImplementedError, match="pre-filled cache"):
        llama.generate(PROMPT, do_sample=False, max_new_tokens=10, past_key_values=cache, assistant_model=drafter)


@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_empty_cache_objects_stay_exact(llama, kind):
    """An empty cache object passed in is fine: a DynamicCache, and a StaticCache (croppable in transformers 5.24;
    only `cache_implementation="static"` is refused, in tests/decoding/test_candidate.py)."""
    drafter = drafter_for(llama)
    plain = llama.generate(PROMPT, do_sample=False, max_new_tokens=30)
    cache = DynamicCache(config=llama.config) if kind == "dynamic" else StaticCache(config=llama.config, max_cache_len=64)
    with oracle_drafts(plain):
        spec = llama.generate(PROMPT, do_sample=False, max_new_tokens=30, past_key_values=cache, assistant_model=drafter)
    assert spec.tolist() == plain.tolist()
    assert len(drafter.last_stats.acceptance_histogram) > 2  # several acceptance lengths, so crops happened


# ---- the context limit --------------------------------------------------------------------------------


def test_generation_up_to_exactly_the_context_limit(llama):
    context = llama.config.max_position_embeddings  # 256
    drafter = drafter_for(llama)
    new = context - PROMPT.shape[1]
    plain = llama.generate(PROMPT, do_sample=False, max_new_tokens=new, min_new_tokens=new)
    with oracle_drafts(plain):
        spec = llama.generate(PROMPT, do_sample=False, max_new_tokens=new, min_new_tokens=new, assistant_model=drafter)
    assert spec.shape[1] == context and spec.tolist() == plain.tolist()


@pytest.mark.parametrize("prompt_len", [256, 300])
def test_prompt_at_or_past_the_context_is_named(llama, prompt_len):
    drafter = drafter_for(llama)
    prompt = torch.arange(prompt_len).remainder(60)[None]
    with pytest.raises(ValueError, match="context is 256"):
        llama.generate(prompt, max_new_tokens=1, assistant_model=drafter)


# ---- non-finite target logits -------------------------------------------------------------------------


@pytest.mark.parametrize("do_sample", [False, True])
@pytest.mark.parametrize("poison", ["+inf everywhere", "+inf on one token", "NaN on one token"])
def test_non_finite_target_logits_are_named(llama, poison, do_sample):
    drafter = drafter_for(llama)
    value = float("nan") if poison.startswith("NaN") else float("inf")
    cols = slice(None) if poison.endswith("everywhere") else slice(3, 4)

    def hook(module, args, out):
        out = out.clone()
        out[..., cols] = value
        return out

    handle = llama.lm_head.register_forward_hook(hook)
    try:
        with pytest.raises(ValueError, match=r"NaN/\+inf"):
            llama.generate(PROMPT, max_new_tokens=5, do_sample=do_sample, assistant_model=drafter)
    finally:
        handle.remove()


@pytest.mark.parametrize("field,value", [("hidden_size", "64"), ("target_layer_ids", [0, "2"]), ("architectures", 5),
                                         ("block_size", 4.0), ("head_type", 3)])
def test_a_config_field_of_the_wrong_type_is_named(llama, tmp_path, field, value):
    path = saved(llama, tmp_path)
    cfg = json.loads((path / "config.json").read_text())
    cfg[field] = value
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=f"'{field}' must be"):
        DSparkDrafter.from_pretrained(path, target=llama)


def test_a_config_that_is_not_an_object_is_named(llama, tmp_path):
    path = saved(llama, tmp_path)
    (path / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a DSpark drafter's config"):
        DSparkDrafter.from_pretrained(path, target=llama)


def test_non_finite_drafter_logits_are_named_when_sampling(llama):
    drafter = drafter_for(llama)
    handle = drafter.norm.register_forward_hook(lambda m, a, out: out * float("nan"))
    try:
        with pytest.raises(ValueError, match=r"the drafter produced NaN/\+inf logits"):
            llama.generate(PROMPT, max_new_tokens=8, do_sample=True, assistant_model=drafter)
        plain = llama.generate(PROMPT, max_new_tokens=8, do_sample=False)  # greedy: drafts are only proposals
        assert llama.generate(PROMPT, max_new_tokens=8, do_sample=False, assistant_model=drafter).tolist() == plain.tolist()
    finally:
        handle.remove()
