"""The architecture matrix: every text causal-LM architecture transformers registers, built tiny from
its own config class (no download), and what DSpark does with it.

Enumeration comes from transformers' auto mappings, so a new transformers release shows its new architectures.
Sizes are shrunk by *field name* (hidden 64, 4 layers, vocab 256, MoE 4 experts, ...), never by architecture name.
Composite configs with vision/audio towers are not built here (their text models, where transformers has one, are).
"""

from __future__ import annotations

import dataclasses
import re
import time

import torch
from transformers import AutoModelForCausalLM
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from hf_dspark import DecodingOptions, DSparkDrafter
from hf_dspark.decoding.profile import measure_profile
from hf_dspark.model.binding import UnsupportedArchitectureError
from tests.helpers import oracle_drafts, oracle_ngrams

PROMPT = torch.tensor([[5, 17, 3, 42, 8, 11]])
NEW_TOKENS = 24  # with a window of 16, decoding crosses it
_MEDIA = ("vision", "audio", "image", "video", "speech", "vq", "visual")

# Sizes by field name: (names, value). A field is set only if the architecture's config has it.
_SIZES = [
    (("hidden_size", "n_embd", "d_model", "n_embed", "dim_model"), 64),
    (("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers", "encoder_layers"), 4),
    (("num_attention_heads", "n_head", "num_heads", "n_heads", "decoder_attention_heads",
      "encoder_attention_heads"), 4),
    (("vocab_size", "vocab_size_per_layer_input"), 256),
    (("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len"), 256),
    (("head_dim", "attention_head_dim", "kv_channels"), 16),
    (("global_head_dim",), 32),
    (("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", "num_routed_experts"), 4),
    (("num_experts_per_tok", "moe_topk", "num_selected_experts", "moe_k"), 2),
    (("n_shared_experts", "num_shared_experts", "moe_num_shared_experts"), 1),
    (("n_group", "topk_group", "first_k_dense_replace"), 1),
    (("kv_lora_rank",), 16), (("q_lora_rank",), 32),
    (("qk_rope_head_dim", "qk_nope_head_dim", "rotary_dim"), 8), (("v_head_dim",), 16),
    (("sliding_window", "attention_chunk_size"), 16),
    (("linear_key_head_dim", "linear_value_head_dim"), 16), (("linear_num_key_heads",), 2),
    (("linear_num_value_heads",), 4),
    (("index_head_dim",), 16), (("index_n_heads",), 2), (("index_topk",), 8),
    (("num_kv_shared_layers",), 0), (("hidden_size_per_layer_input",), 0),
]
_SIZE_OF = {name: value for names, value in _SIZES for name in names}
_FFN = 128  # any *intermediate_size / ffn width
_SPECIAL = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")
_DEPTH = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")


def architectures() -> list[str]:
    """model_type of every causal LM transformers maps (sorted); composite media configs too (reported, not built)."""
    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def _shrunk(d: dict, sub_configs=()) -> dict:
    """Config kwargs with every size field of `d` (a config's to_dict()) shrunk; sub-configs likewise."""
    kw = {}
    heads = d.get("num_attention_heads", d.get("n_head"))
    for name, value in d.items():
        if name in sub_configs and isinstance(value, dict):
            kw[name] = _shrunk(value)
        elif name in _SPECIAL:  # ids of the full-size vocabulary, folded into ours
            kw[name] = value % 256 if isinstance(value, int) else value
        elif isinstance(value, bool) or not isinstance(value, int):
            continue
        elif name == "head_dim" and "qk_rope_head_dim" in d:
            kw[name] = _SIZE_OF["qk_rope_head_dim"]  # multi-head latent attention: head_dim is the RoPE part
        elif name in _SIZE_OF:
            kw[name] = _SIZE_OF[name]
        elif name.endswith(("intermediate_size", "ffn_dim")) or name in ("n_inner", "ffn_hidden_size", "d_ff"):
            kw[name] = _FFN
        elif name in ("num_key_value_heads", "num_kv_heads", "multi_query_group_num", "n_head_kv"):
            kw[name] = 4 if value == heads else min(value, 2)  # keep MHA as MHA, GQA/MQA as GQA/MQA
    if d.get("layer_types"):  # the default pattern, cut to our depth
        depth = next((kw[n] for n in _DEPTH if n in kw), len(d["layer_types"]))
        pattern = list(d["layer_types"])
        kw["layer_types"] = (pattern * depth)[:depth] if len(set(pattern)) == 1 else _mixed(pattern, depth)
    if "use_cache" in d:
        kw["use_cache"] = True  # generate decodes on a KV cache (some configs, e.g. MPT's, default to False)
    if "is_decoder" in d:
        kw["is_decoder"] = True  # encoder-style LM heads are causal only as decoders (transformers' own advice)
    return kw


def tiny_config(model_type: str):
    """The architecture's config class with sizes shrunk; derived fields (layer_types, ...) recomputed."""
    cls = CONFIG_MAPPING[model_type]
    return cls(**_shrunk(cls().to_dict(), getattr(cls, "sub_configs", None) or {}))


def _mixed(pattern: list, depth: int) -> list:
    """A depth-long layer pattern that keeps every layer type of the default one (so hybrids stay hybrid)."""
    kinds = list(dict.fromkeys(pattern))
    out = (pattern * depth)[:depth]
    for i, kind in enumerate(kinds[: depth]):
        if kind not in out:
            out[depth - 1 - i] = kind
    return out


def is_media(model_type: str) -> bool:
    sub = getattr(CONFIG_MAPPING[model_type], "sub_configs", {}) or {}
    return any(any(m in name for m in _MEDIA) for name in sub)


def build(model_type: str, dtype=torch.float32):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(model_type), dtype=dtype)
    model.generation_config.eos_token_id = model.generation_config.pad_token_id = None
    model.generation_config.bos_token_id = None
    return model.eval()


@dataclasses.dataclass
class Outcome:
    model_type: str
    status: str  # "supported" | "refused" | "not built" (media towers / transformers cannot build or run it tiny)
    reason: str = ""
    seconds: float = 0.0
    fallback: str = ""  # supported: why DSpark's own loop sent its calls to the assisted loop ("": it took them)


def greedy(model, prompt, **kw):
    return model.generate(prompt, do_sample=False, max_new_tokens=NEW_TOKENS, **kw)


@torch.no_grad()
def run(model_type: str) -> Outcome:
    """Build tiny, bind a fresh drafter, check greedy identity under four verify set-ups plus one sampled run.
    A DSpark failure that is not an UnsupportedArchitectureError propagates (the test fails)."""
    t0 = time.perf_counter()
    done = lambda status, reason="", fallback="": Outcome(model_type, status, reason, time.perf_counter() - t0,  # noqa: E731
                                                          fallback)
    if is_media(model_type):
        return done("not built", "composite config with vision/audio towers")
    try:
        model = build(model_type)
        plain = greedy(model, PROMPT)
    except Exception as e:  # transformers itself cannot build or generate with this tiny config
        return done("not built", f"transformers: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
    try:
        drafter = DSparkDrafter.from_target(model, block_size=4, num_hidden_layers=1, markov_rank=8)
    except UnsupportedArchitectureError as e:
        return done("refused", str(e))
    # measured past the sliding window (16) as `hf-dspark profile` would, then used by both scheduler policies
    profile = measure_profile(model, drafter, cache_len=64, warmup=0, repeats=1)
    for policy, ngrams in (("all", False), ("scheduler", False), (2, False), ("auto", True)):  # the last: defaults
        drafter.options.verify_policy, drafter.options.ngram_drafts = policy, ngrams
        drafter.options.device_profile = profile if policy in ("scheduler", "auto") else None
        with oracle_drafts(plain):
            spec = greedy(model, PROMPT, assistant_model=drafter)
        assert spec.tolist() == plain.tolist(), f"{model_type}: greedy output differs under verify_policy={policy!r}"
    drafter.options.verify_policy, drafter.options.device_profile, drafter.options.ngram_drafts = "all", None, True
    with oracle_drafts(plain), oracle_ngrams(plain, vocab=model.get_output_embeddings().weight.shape[0]):
        spec = greedy(model, PROMPT, assistant_model=drafter)
    assert spec.tolist() == plain.tolist(), f"{model_type}: greedy output differs with n-gram drafts"
    assert drafter.last_stats.ngram_rounds > 0, f"{model_type}: no n-gram round ran"
    drafter.options.ngram_drafts = False
    torch.manual_seed(0)
    sampled = model.generate(PROMPT, do_sample=True, max_new_tokens=NEW_TOKENS, assistant_model=drafter)
    assert sampled.shape[1] == PROMPT.shape[1] + NEW_TOKENS, f"{model_type}: the sampled run stopped early"
    # DSpark's own loop (static cache, padded verification, rollback by position): the same identity where it takes
    # the call; where it does not, the call runs on the assisted loop and names why
    for policy in ("all", 2):
        with oracle_drafts(plain):
            spec = greedy(model, PROMPT, assistant_model=drafter,
                          dspark_options=DecodingOptions(policy, ngram_drafts=False, loop="static"))
        assert spec.tolist() == plain.tolist(), f"{model_type}: greedy output differs on the static loop ({policy!r})"
    stats = drafter.last_stats
    assert (stats.loop == "static") != bool(stats.fallback), (model_type, stats.loop, stats.fallback)
    return done("supported", fallback=stats.fallback)


def render(outcomes: list[Outcome]) -> str:
    """docs/supported_architectures.md from the matrix's outcomes (sorted by model_type)."""
    import transformers

    by = {s: [o for o in sorted(outcomes, key=lambda o: o.model_type) if o.status == s]
          for s in ("supported", "refused", "not built")}
    lines = [
        "# Supported target architectures",
        "",
        f"Generated by the architecture matrix (`tests/test_architectures.py`, `python -m tests.arch_matrix` rewrites "
        f"this file) on transformers {transformers.__version__}: every model type in transformers' "
        "`MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`, built tiny from its own config class (hidden 64, 4 layers, vocab 256, "
        "seed 0, float32) with a fresh `DSparkDrafter.from_target(model)`. Do not edit by hand.",
        "",
        f"## Supported ({len(by['supported'])})",
        "",
        "Greedy output equal to plain `generate` token for token under `verify_policy` \"all\", \"scheduler\" (on a "
        "measured device profile), 2 and the defaults (\"auto\" + n-gram drafts), and with n-gram drafts on every "
        "other round; one sampled run completes.",
        "",
        ", ".join(f"`{o.model_type}`" for o in by["supported"]),
        "",
        f"### On DSpark's own loop (`DecodingOptions(loop=\"static\" | \"compiled\")`): "
        f"{sum(not o.fallback for o in by['supported'])} of {len(by['supported'])}",
        "",
        "The same greedy identity on the static loop under `verify_policy` \"all\" and 2:",
        "",
        ", ".join(f"`{o.model_type}`" for o in by["supported"] if not o.fallback),
        "",
        "The others run every call on transformers' assisted loop (as by default, exact), for the reason the loop "
        "names. The tiny configs' sliding windows are 16 positions, shorter than any static cache the loop allocates "
        "(a multiple of 512); a model whose window is at least that long takes the loop (tests/decoding/test_loop.py).",
        "",
        "| model type | why the own loop does not take it |",
        "|---|---|",
        *(f"| `{o.model_type}` | {_cell(o.fallback)} |" for o in by["supported"] if o.fallback),
        "",
        f"## Refused at `from_target` / `bind` ({len(by['refused'])})",
        "",
        "`hf_dspark.model.binding.UnsupportedArchitectureError`, with this message:",
        "",
        "| model type | why |",
        "|---|---|",
        *(f"| `{o.model_type}` | {_cell(o.reason)} |" for o in by["refused"]),
        "",
        f"## Not in the matrix ({len(by['not built'])})",
        "",
        "Composite configs with vision/audio towers (their text models are above where transformers has one), and "
        "model types whose tiny config transformers itself cannot build or run (plain `generate` fails): untested.",
        "",
        "| model type | why |",
        "|---|---|",
        *(f"| `{o.model_type}` | {_cell(o.reason)} |" for o in by["not built"]),
        "",
    ]
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "/")  # a table cell


def documented(outcome: Outcome) -> Outcome:
    """What DOC records of an outcome: its status, and its reason or the own loop's fallback as table cells."""
    supported = outcome.status == "supported"
    return Outcome(outcome.model_type, outcome.status, "" if supported else _cell(outcome.reason),
                   fallback=_cell(outcome.fallback) if supported else "")


_SECTIONS = {"## Supported": "supported", "### On DSpark's own loop": "own loop", "## Refused": "refused",
             "## Not in the matrix": "not built"}
_ROW = re.compile(r"^\| `([^`]+)` \| (.*) \|$")


def parse(doc: str) -> dict[str, Outcome]:
    """DOC's rows back as documented outcomes, by model type (render(parse(doc).values()) == doc for a current DOC).
    The matrix is checked one architecture per test against these rows, so no test reruns the others' models."""
    rows: dict[str, Outcome] = {}
    section = None
    for line in doc.splitlines():
        section = next((s for head, s in _SECTIONS.items() if line.startswith(head)), section)
        names = re.findall(r"`([^`]+)`", line) if line.startswith("`") and section in ("supported", "own loop") else []
        if section == "supported":
            rows.update({n: Outcome(n, "supported") for n in names})
        row = _ROW.match(line)
        if row is None:
            continue
        name, cell = row.groups()
        if section == "own loop":
            rows[name].fallback = cell
        else:
            rows[name] = Outcome(name, section, cell)
    return rows


DOC = "docs/supported_architectures.md"

if __name__ == "__main__":  # python -m tests.arch_matrix: run the matrix, rewrite DOC
    from pathlib import Path

    outcomes = [run(t) for t in architectures()]
    Path(DOC).write_text(render(outcomes))
    print(f"wrote {DOC}: " + ", ".join(f"{s} {sum(o.status == s for o in outcomes)}"
                                      for s in ("supported", "refused", "not built")))
