"""DeepSpec checkpoints: synthetic files written from the documented format load strictly, bind to tiny Qwen3 /
Gemma-4 targets, keep greedy identity and sampling exactness; every malformed file raises an error naming the
problem; export → import is exact."""

import json
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from hf_dspark import DSparkDrafter
from hf_dspark.model import deepspec
from hf_dspark.model.binding import placement
from hf_dspark.model.deepspec import DeepSpecFormatError
from tests.conftest import tiny_target
from tests.deepspec_files import checkpoint, gemma4_config, qwen3_config, tensors_for, tiny_gemma4, write
from tests.helpers import PROMPT, assert_identical
from tests.sampling_check import ALPHA, exact_distribution, fit_pvalue, processors, sample_counts


def target_for(family, **kw):
    return tiny_gemma4(**kw) if family == "gemma4" else tiny_target("qwen3", **kw)


def load(folder, target, **kw):
    return DSparkDrafter.from_pretrained(folder, target=target, **kw)


# ---- loads, binds, greedy identity ---------------------------------------------------------------------
@pytest.mark.parametrize("family, kw", [
    ("qwen3", dict(head="vanilla")),
    ("qwen3", dict(head="gated")),
    ("qwen3", dict(head="rnn", with_markov=False)),
    ("qwen3", dict(rank=0, conf=False)),  # a DeepSpec DFlash checkpoint
    ("gemma4", dict(head="vanilla")),
    ("gemma4", dict(head="rnn", k_eq_v=False)),
])
def test_synthetic_checkpoint_loads_and_keeps_greedy_identity(tmp_path, family, kw):
    target = target_for(family)
    folder = checkpoint(tmp_path, target, family, **kw)
    drafter = load(folder, target)
    c = drafter.config
    assert c.head_type == {"vanilla": "markov", "gated": "gated", "rnn": "rnn"}[kw.get("head", "vanilla")] \
        if kw.get("rank", 8) else c.head_type == "none"
    assert (drafter.confidence_head is not None) == kw.get("conf", True)
    assert c.layer_variant == ("gemma4" if family == "gemma4" else "default")
    stored = load_file(folder / "model.safetensors")
    ours = drafter.state_dict()
    for key, value in stored.items():  # every drafter tensor loaded exactly; the target's copies dropped
        if key in ("embed_tokens.weight", "lm_head.weight"):
            assert key not in ours
        else:
            assert torch.equal(ours[key], value.float()), key
    assert_identical(target, drafter, max_new_tokens=24)
    assert_identical(target, drafter, oracle=False, max_new_tokens=12)


def test_qwen3_gemma_tensor_counts_match_the_doc(tmp_path):
    """§0: 64 tensors for a released-shape Qwen3 drafter (5 layers), 74 for Gemma4 (k_eq_v)."""
    q = qwen3_config(tiny_target("qwen3", layers=6), layers=5, taps=(0, 1, 2, 3, 4))
    g = gemma4_config(tiny_gemma4(layers=6), layers=5, taps=(0, 1, 2, 3, 4))
    assert len(tensors_for(q, tiny_target("qwen3", layers=6))) == 64
    assert len(tensors_for(g, tiny_gemma4(layers=6))) == 74
    assert len(deepspec.expected_keys(deepspec.config_from_deepspec(q))) == 64
    assert len(deepspec.expected_keys(deepspec.config_from_deepspec(g))) == 74


# ---- the Gemma-4 layer variant against a hand-written reference (deepspec-checkpoints.md §4) --------------
def _rms(x, w=None, eps=1e-6):
    y = x * torch.pow(x.pow(2).mean(-1, keepdim=True) + eps, -0.5)
    return y if w is None else y * w


def _rope(x, pos, theta, partial):
    """x [n, heads, h]; half-split rotation; frequencies θ^(-2j/h) on the first partial·h/2 pairs, 0 after."""
    h = x.shape[-1]
    rot = int(partial * h // 2)
    inv = torch.cat([theta ** (-torch.arange(0, 2 * rot, 2, dtype=torch.float) / h), torch.zeros(h // 2 - rot)])
    ang = pos[:, None].float() * inv[None]
    cos, sin = torch.cat([ang, ang], -1).cos()[:, None], torch.cat([ang, ang], -1).sin()[:, None]
    x1, x2 = x[..., : h // 2], x[..., h // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def reference_backbone(sd, raw, feats, embeds):
    """Doc formulas, written independently: feats [n, m·d] (context), embeds [Q, d] (block) → h [Q, d]."""
    gemma = raw["architectures"][0] == "Gemma4DSparkModel"
    H = raw["num_attention_heads"]
    h = raw["global_head_dim"] if gemma else raw["head_dim"]
    k_eq_v = gemma and raw["attention_k_eq_v"]
    rope = raw["rope_parameters"]["full_attention"] if gemma else raw["rope_parameters"]
    theta, partial = rope["rope_theta"], rope.get("partial_rotary_factor", 1.0)
    n, Q = feats.shape[0], embeds.shape[0]
    pos_all = torch.arange(n + Q)
    W = {k: v.float() for k, v in sd.items()}
    ctx = _rms(feats @ W["fc.weight"].T, W["hidden_norm.weight"])
    x = embeds
    act = (lambda t: F.gelu(t, approximate="tanh")) if gemma else F.silu
    for i in range(raw["num_hidden_layers"]):
        p = f"layers.{i}."
        a = _rms(x, W[p + "input_layernorm.weight"])
        kin = torch.cat([ctx, a])
        q = _rope(_rms((a @ W[p + "self_attn.q_proj.weight"].T).view(Q, H, h), W[p + "self_attn.q_norm.weight"]),
                  pos_all[n:], theta, partial)
        kraw = (kin @ W[p + "self_attn.k_proj.weight"].T).view(n + Q, -1, h)
        k = _rope(_rms(kraw, W[p + "self_attn.k_norm.weight"]), pos_all, theta, partial)
        v = kraw if k_eq_v else (kin @ W[p + "self_attn.v_proj.weight"].T).view(n + Q, -1, h)
        if gemma:
            v = _rms(v)
        rep = H // k.shape[1]
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        scale = 1.0 if gemma else h ** -0.5
        att = torch.softmax(torch.einsum("qhd,khd->hqk", q, k) * scale, -1)
        o = torch.einsum("hqk,khd->qhd", att, v).reshape(Q, H * h) @ W[p + "self_attn.o_proj.weight"].T

        def mlp(t):
            return (act(t @ W[p + "mlp.gate_proj.weight"].T) * (t @ W[p + "mlp.up_proj.weight"].T)) @ W[p + "mlp.down_proj.weight"].T

        if gemma:
            x = x + _rms(o, W[p + "post_attention_layernorm.weight"])
            x = x + _rms(mlp(_rms(x, W[p + "pre_feedforward_layernorm.weight"])), W[p + "post_feedforward_layernorm.weight"])
            x = x * W.get(p + "layer_scalar", torch.ones(1))
        else:
            x = x + o
            x = x + mlp(_rms(x, W[p + "post_attention_layernorm.weight"]))
    return _rms(x, W["norm.weight"])


@pytest.mark.parametrize("family, kw", [("gemma4", dict(k_eq_v=True)), ("gemma4", dict(k_eq_v=False)), ("qwen3", {})])
def test_backbone_matches_the_documented_formulas(tmp_path, family, kw):
    target = target_for(family)
    raw = (gemma4_config if family == "gemma4" else qwen3_config)(target, **kw)
    sd = tensors_for(raw, target)
    if family == "gemma4":
        sd["layers.1.layer_scalar"] = torch.tensor([0.5], dtype=torch.bfloat16)  # honoured when ≠ 1
    drafter = load(write(tmp_path, raw, sd), target)
    torch.manual_seed(3)
    n, Q, d = 5, raw["block_size"], raw["hidden_size"]
    feats = torch.randn(n, len(raw["target_layer_ids"]) * d)
    embeds = torch.randn(Q, d)
    with torch.no_grad():
        kv = drafter.context_kv(feats[None], torch.arange(n)[None])
        got = drafter.backbone(embeds[None], torch.arange(n, n + Q)[None], kv)[0]
    want = reference_backbone(sd, raw, feats, embeds)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_gemma_embedding_is_scaled_and_logits_softcapped(tmp_path):
    target = tiny_gemma4()
    drafter = load(checkpoint(tmp_path, target, "gemma4"), target)
    ids = torch.tensor([[4, 7]])
    raw = target.get_input_embeddings().weight[ids]
    torch.testing.assert_close(drafter.embed(ids), raw * math.sqrt(target.config.hidden_size))
    big = torch.full((1, target.config.hidden_size), 50.0)
    assert drafter.base_logits(big).abs().max() <= 30.0


# ---- sampling exactness --------------------------------------------------------------------------------
@pytest.mark.parametrize("family, kw", [("qwen3", dict(head="gated")), ("gemma4", dict(head="rnn", k_eq_v=False))])
def test_sampling_exactness(tmp_path, family, kw):
    V, steps = 8, 5
    prompt = torch.tensor([[1, 5, 2]])
    if family == "gemma4":
        target = tiny_gemma4(vocab=V, hidden=16, layers=3, logit_scale=6.0)
    else:
        target = tiny_target("qwen3", vocab=V, hidden=16, layers=3, heads=2, kv_heads=1, logit_scale=6.0)
    folder = checkpoint(tmp_path, target, family, taps=(0, 1), block=3, rank=4, mask=V - 1, **kw)
    sd = load_file(folder / "model.safetensors")
    for k in sd:  # a strong sequential bias, so q differs a lot from the base logits
        if k.startswith("markov_head."):
            sd[k] = (sd[k].float() / 0.3).to(torch.bfloat16)
    save_file(sd, folder / "model.safetensors", metadata={"format": "pt"})
    drafter = load(folder, target)
    exact = exact_distribution(target, prompt, steps, processors(temperature=0.8))
    samples = sample_counts(target, drafter, prompt, steps, 600, seed=11, temperature=0.8)
    assert drafter.last_stats.rounds
    p = fit_pvalue(samples, exact)
    assert p >= ALPHA, f"{family}: speculative samples deviate from the target's law (p={p:.2e})"


# ---- strictness: each malformed file raises an error naming the problem --------------------------------
@pytest.fixture
def qwen_files(tmp_path):
    target = tiny_target("qwen3")
    cfg = qwen3_config(target)
    return target, tmp_path, cfg, tensors_for(cfg, target)


def _expect(target, folder, cfg, sd, match):
    write(folder, cfg, sd)
    with pytest.raises(ValueError, match=match):
        load(folder, target)


def test_renamed_tensor(qwen_files):
    target, folder, cfg, sd = qwen_files
    sd["layers.0.mlp.gate.weight"] = sd.pop("layers.0.mlp.gate_proj.weight")
    _expect(target, folder, cfg, sd, r"missing.*layers\.0\.mlp\.gate_proj\.weight.*unexpected.*layers\.0\.mlp\.gate\.weight")


def test_missing_tensor(qwen_files):
    target, folder, cfg, sd = qwen_files
    del sd["markov_head.markov_w2.weight"]
    _expect(target, folder, cfg, sd, r"missing.*markov_head\.markov_w2\.weight.*\[V, r\] = \[64, 8\]")


def test_extra_tensor(qwen_files):
    target, folder, cfg, sd = qwen_files
    sd["markov_head.gate_proj.weight"] = torch.zeros(8, 40, dtype=torch.bfloat16)  # gated key, vanilla config
    _expect(target, folder, cfg, sd, r"unexpected.*markov_head\.gate_proj\.weight")


def test_wrong_shape(qwen_files):
    target, folder, cfg, sd = qwen_files
    sd["layers.1.self_attn.k_proj.weight"] = torch.zeros(8, 32, dtype=torch.bfloat16)
    _expect(target, folder, cfg, sd, r"wrong shape.*layers\.1\.self_attn\.k_proj\.weight: stored \[8, 32\], "
                                     r"config says \[K\*h, d\] = \[16, 32\]")


@pytest.mark.parametrize("field, value, match", [
    ("markov_rank", 16, r"markov_head\.markov_w1\.weight: stored \[64, 8\], config says \[V, r\] = \[64, 16\]"),
    ("confidence_head_with_markov", False, r"confidence_head\.proj\.weight: stored \[1, 40\], config says \[1, c\] = \[1, 32\]"),
    ("num_hidden_layers", 1, r"unexpected.*layers\.1\."),
    ("target_layer_ids", [0, 1, 2], r"fc\.weight: stored \[32, 64\], config says \[d, m\*d\] = \[32, 96\]"),
    ("markov_head_type", "lstm", "markov_head_type 'lstm'"),
])
def test_config_inconsistent_with_tensors(qwen_files, field, value, match):
    target, folder, cfg, sd = qwen_files
    _expect(target, folder, dict(cfg, **{field: value}), sd, match)


@pytest.mark.parametrize("drop", ["block_size", "mask_token_id", "num_target_layers", "markov_head_type", "head_dim"])
def test_missing_config_field(qwen_files, drop):
    target, folder, cfg, sd = qwen_files
    cfg.pop(drop)
    _expect(target, folder, cfg, sd, f"lacks required field.*{drop}")


@pytest.mark.parametrize("arch, match", [("Qwen3Eagle3Model", "Eagle3"), ("DFlashDraftModel", "z-lab DFlash")])
def test_foreign_formats_are_named(qwen_files, arch, match):
    target, folder, cfg, sd = qwen_files
    _expect(target, folder, dict(cfg, architectures=[arch]), sd, match)


def test_stored_embedding_must_equal_the_targets(qwen_files):
    target, folder, cfg, sd = qwen_files
    sd["lm_head.weight"] = sd["lm_head.weight"].clone()
    sd["lm_head.weight"][3, 4] += 1.0
    _expect(target, folder, cfg, sd, r"lm_head\.weight .* differs from the target's")


def test_wrong_target_is_named(tmp_path):
    target = tiny_target("qwen3")
    folder = checkpoint(tmp_path, target)
    with pytest.raises(ValueError, match="num_hidden_layers"):
        load(folder, tiny_target("qwen3", layers=5))
    with pytest.raises(ValueError, match="Gemma-4 target"):
        load(checkpoint(tmp_path / "g", tiny_gemma4(), "gemma4"), target)
    with pytest.raises(ValueError, match="needs its target"):
        DSparkDrafter.from_pretrained(folder)


def test_tolerated_variants(qwen_files):
    """Stripped embed/head, `_orig_mod.` / uniform `model.` prefixes, RoPE buffers, 4.x rope_theta / torch_dtype."""
    target, folder, cfg, sd = qwen_files
    ref = dict(sd)
    sd = {"model." + k.replace("layers.0.", "layers.0._orig_mod."): v for k, v in sd.items()
          if k not in ("embed_tokens.weight", "lm_head.weight")}
    sd["model.rotary_emb.inv_freq"] = torch.ones(4)
    cfg = dict(cfg, rope_theta=cfg["rope_parameters"]["rope_theta"], torch_dtype="bfloat16")
    cfg.pop("rope_parameters"), cfg.pop("dtype")
    drafter = load(write(folder, cfg, sd), target)
    assert torch.equal(drafter.state_dict()["layers.0.mlp.up_proj.weight"], ref["layers.0.mlp.up_proj.weight"].float())


def test_sharded_checkpoint(qwen_files):
    target, folder, cfg, sd = qwen_files
    write(folder, cfg, {})
    (folder / "model.safetensors").unlink()
    keys = sorted(sd)
    shards = {"model-00001-of-00002.safetensors": keys[::2], "model-00002-of-00002.safetensors": keys[1::2]}
    for name, ks in shards.items():
        save_file({k: sd[k] for k in ks}, folder / name, metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {k: name for name, ks in shards.items() for k in ks}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    assert load(folder, target).config.block_size == cfg["block_size"]


# ---- Gemma-4 config quirks (§2.5, §6.1) ------------------------------------------------------------------
def test_gemma_quirks(tmp_path):
    target = tiny_gemma4()
    cfg = gemma4_config(target)
    sd = tensors_for(cfg, target)
    # a resumed run: model_type gemma4_text and the class's extra defaults; top-level RoPE pair to be ignored
    resumed = dict(cfg, model_type="gemma4_text", num_experts=None, top_k_experts=None, moe_intermediate_size=None)
    drafter = load(write(tmp_path / "a", resumed, sd), target)
    assert drafter.config.rope_parameters == cfg["rope_parameters"]["full_attention"]
    assert drafter.config.head_dim == 16 and drafter.config.num_key_value_heads == 1
    assert drafter.config.hidden_act == "gelu_pytorch_tanh"
    # layer_scalar missing → 1.0
    stripped = {k: v for k, v in sd.items() if not k.endswith("layer_scalar")}
    assert torch.equal(load(write(tmp_path / "b", cfg, stripped), target).layers[0].layer_scalar, torch.ones(1))
    for i, (change, match) in enumerate([
        (dict(enable_moe_block=True), "enable_moe_block"),
        (dict(hidden_size_per_layer_input=256), "hidden_size_per_layer_input"),
        (dict(use_double_wide_mlp=True, num_kv_shared_layers=1), "double width"),
        (dict(rope_parameters={"rope_type": "default", "rope_theta": 1e6}), "full_attention"),
        (dict(attention_k_eq_v=False), r"missing.*v_proj.*attention_k_eq_v=False disagrees"),
    ]):
        with pytest.raises(ValueError, match=match):
            load(write(tmp_path / f"e{i}", dict(cfg, **change), sd), target)
    with_v = dict(sd, **{"layers.0.self_attn.v_proj.weight": torch.zeros(16, 32, dtype=torch.bfloat16)})
    with pytest.raises(ValueError, match=r"unexpected.*v_proj.*attention_k_eq_v=True disagrees"):
        load(write(tmp_path / "v", cfg, with_v), target)


# ---- calibration sidecar -----------------------------------------------------------------------------------
def test_calibration_lives_beside_the_checkpoint(qwen_files):
    target, folder, cfg, sd = qwen_files
    write(folder, cfg, sd)
    temps = [0.5, 1.5, 2.0, 3.0]
    deepspec.write_calibration(folder, temps, sd["fc.weight"], target="tiny")
    drafter = load(folder, target)
    assert drafter.config.confidence_temperatures == temps
    assert drafter.config.calibration is None  # no measured survival in that file: no gate prior
    drafter.config.confidence_temperatures = [1.25] * 4  # what `hf-dspark calibrate` does, then saves beside
    drafter.config.calibration = [
        {"temperature": 0.0, "confidence_temperatures": [2.0] * 4, "prefix_survival": [0.7, 0.5, 0.3, 0.1]},
        {"temperature": 1.0, "confidence_temperatures": [1.25] * 4, "confidence_biases": [-0.3, 0.0, 0.1, 0.0],
         "prefix_survival": [0.5, 0.3, 0.1, 0.0]}]
    deepspec.save_calibration(drafter)
    again = load(folder, target)
    assert again.config.confidence_temperatures == [1.25] * 4
    assert again.config.calibration == drafter.config.calibration  # every temperature's entry travels too
    assert again.config.confidence_scaling_at(0.0) == ([2.0] * 4, [0.0] * 4)
    assert json.loads((folder / "config.json").read_text()) == cfg  # the DeepSpec files are never rewritten
    sd["fc.weight"] = sd["fc.weight"] * 2  # other weights: the sidecar no longer applies
    save_file(sd, folder / "model.safetensors", metadata={"format": "pt"})
    assert load(folder, target).config.confidence_temperatures == [1.0] * 4
    assert load(folder, target).config.calibration is None


def test_a_sidecar_of_the_single_entry_format_is_read_as_one_entry(qwen_files):
    """Sidecars written before 2026-12-02 hold one {temperature, prefix_survival} dict: it scales with the
    file's top-level temperatures."""
    target, folder, cfg, sd = qwen_files
    write(folder, cfg, sd)
    deepspec.write_calibration(folder, [0.5, 1.5, 2.0, 3.0], sd["fc.weight"],
                               {"temperature": 1.0, "prefix_survival": [0.5, 0.3, 0.1, 0.0]})
    assert load(folder, target).config.calibration == [{"temperature": 1.0, "confidence_temperatures": [0.5, 1.5, 2.0, 3.0],
                                                        "prefix_survival": [0.5, 0.3, 0.1, 0.0]}]


def test_a_sidecar_with_bad_measured_survival_is_refused(qwen_files):
    target, folder, cfg, sd = qwen_files
    write(folder, cfg, sd)
    deepspec.write_calibration(folder, [1.0] * 4, sd["fc.weight"], {"temperature": 1.0, "prefix_survival": [0.5, 0.6]})
    with pytest.raises(deepspec.DeepSpecFormatError, match="dspark_calibration.json.*prefix_survival"):
        load(folder, target)


# ---- export → import -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("family, head", [("qwen3", "markov"), ("qwen3", "gated"), ("llama", "rnn"), ("qwen3", "none")])
def test_export_import_round_trip_is_exact(tmp_path, family, head):
    target = tiny_target(family)
    torch.manual_seed(1)
    drafter = DSparkDrafter.from_target(target, block_size=4, target_layer_ids=[0, 2], head_type=head, markov_rank=8,
                                        confidence_head=head != "none")
    if head != "none":
        drafter.config.confidence_temperatures = [0.7, 1.1, 1.3, 2.0]
        drafter.config.calibration = [{"temperature": 0.0, "confidence_temperatures": [0.7, 1.1, 1.3, 2.0],
                                       "prefix_survival": [0.6, 0.4, 0.4, 0.1]}]
    deepspec.export(drafter, tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert raw["architectures"] == ["Qwen3DSparkModel"] and raw["num_target_layers"] == 4
    again = load(tmp_path, target)
    a, b = drafter.state_dict(), again.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert again.config.confidence_temperatures == drafter.config.confidence_temperatures
    assert again.config.calibration == drafter.config.calibration
    for gen in (dict(do_sample=False), dict(do_sample=True, temperature=0.9)):
        torch.manual_seed(0)
        x = target.generate(PROMPT, max_new_tokens=16, assistant_model=drafter, **gen)
        torch.manual_seed(0)
        y = target.generate(PROMPT, max_new_tokens=16, assistant_model=again, **gen)
        assert x.tolist() == y.tolist()


@pytest.mark.parametrize("family, kw", [("qwen3", dict(head="rnn")), ("gemma4", dict(head="gated"))])
def test_import_export_reproduces_the_deepspec_file(tmp_path, family, kw):
    """The mapping table in the other direction: DeepSpec file → our drafter → bf16 export = the same tensors."""
    target = target_for(family)
    src = checkpoint(tmp_path / "src", target, family, **kw)
    deepspec.export(load(src, target), tmp_path / "out", dtype=torch.bfloat16)
    a, b = load_file(src / "model.safetensors"), load_file(tmp_path / "out" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ca, cb = (json.loads((p / "config.json").read_text()) for p in (src, tmp_path / "out"))
    for field in ("architectures", "block_size", "mask_token_id", "target_layer_ids", "markov_rank", "markov_head_type",
                  "enable_confidence_head", "confidence_head_with_markov", "num_target_layers", "num_hidden_layers",
                  "hidden_size", "intermediate_size", "num_attention_heads", "vocab_size", "dtype"):
        assert ca[field] == cb[field], field
    if family == "gemma4":
        assert cb["rope_parameters"]["full_attention"] == ca["rope_parameters"]["full_attention"]
        assert cb["global_head_dim"] == 16 and cb["attention_k_eq_v"] is True


def test_export_cli(tmp_path, char_tokenizer):
    from hf_dspark.cli import main

    target = tiny_target("qwen3")
    target.save_pretrained(tmp_path / "target")
    char_tokenizer.save_pretrained(tmp_path / "target")
    torch.manual_seed(1)
    DSparkDrafter.from_target(target, block_size=4, target_layer_ids=[0, 2], markov_rank=8).save_pretrained(tmp_path / "d")
    assert main(["export", str(tmp_path / "d"), str(tmp_path / "ds"), "--format", "deepspec", "--target",
                 str(tmp_path / "target"), "--dtype", "bfloat16"]) == 0
    assert load_file(tmp_path / "ds" / "model.safetensors")["fc.weight"].dtype == torch.bfloat16
    assert load(tmp_path / "ds", target).config.block_size == 4


def test_export_refuses_what_deepspec_cannot_hold(tmp_path):
    target = tiny_target("qwen3")
    drafter = DSparkDrafter.from_target(target, block_size=4, target_layer_ids=[0, 2], markov_rank=8)
    with pytest.raises(ValueError, match="pruned draft vocabulary"):
        deepspec.export(drafter.set_draft_vocab([1, 2, 3]), tmp_path)
    deepspec.export(drafter.set_draft_vocab(None), tmp_path / "full")  # the error's own advice, followed, works
    assert drafter.draft_vocab is None and "draft_vocab" not in drafter.state_dict()
    plain = DSparkDrafter.from_target(target, block_size=4, target_layer_ids=[0, 2], qk_norm=False)
    with pytest.raises(ValueError, match="qk_norm"):
        deepspec.export(plain, tmp_path)


# ---- device_map / quantized targets (CPU-testable parts; CUDA checks: scripts/gpu_check_deepspec.sh) -----------
@pytest.mark.parametrize("device_map", ["auto", {"": "cpu"}])
def test_device_map_target(tmp_path, device_map):
    from transformers import AutoModelForCausalLM

    from hf_dspark import enable

    tiny_target("qwen3").save_pretrained(tmp_path / "t")
    target = enable(AutoModelForCausalLM.from_pretrained(tmp_path / "t", device_map=device_map, dtype=torch.float32).eval())
    drafter = load(checkpoint(tmp_path / "d", target), target)
    assert drafter.device == target.lm_head.weight.device
    assert_identical(target, drafter, max_new_tokens=16)


def test_placement_follows_the_lm_head_and_refuses_bad_heads():
    target = tiny_target("qwen3")
    assert placement(target) == (torch.device("cpu"), torch.float32)
    with torch.no_grad():
        target.lm_head.weight = torch.nn.Parameter(torch.zeros(64, 32, dtype=torch.int8), requires_grad=False)
    with pytest.raises(ValueError, match="LM head is quantized"):
        placement(target)
    target.lm_head.weight = torch.nn.Parameter(torch.empty(64, 32, device="meta"))
    with pytest.raises(ValueError, match="offloaded"):
        placement(target)
