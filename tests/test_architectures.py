"""The architecture matrix: every causal LM transformers maps either keeps greedy identity with plain
`generate` under every verify set-up (and samples to the end), or is refused at `from_target` by
UnsupportedArchitectureError with its reason; docs/supported_architectures.md is this matrix's output."""

from pathlib import Path

import pytest

from hf_dspark import DSparkDrafter
from hf_dspark.decoding.profile import measure_profile
from tests import arch_matrix
from tests.arch_matrix import PROMPT
from tests.helpers import oracle_drafts

OUTCOMES: dict[str, arch_matrix.Outcome] = {}
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _profiles_elsewhere(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_DSPARK_CACHE", str(tmp_path))  # measured profiles never land in the user's cache


def _outcome(model_type: str) -> arch_matrix.Outcome:
    if model_type not in OUTCOMES:
        OUTCOMES[model_type] = arch_matrix.run(model_type)
    return OUTCOMES[model_type]


STALE = f"{arch_matrix.DOC} is stale: run `python -m tests.arch_matrix`"


def _documented() -> dict[str, arch_matrix.Outcome]:
    return arch_matrix.parse((ROOT / arch_matrix.DOC).read_text())


@pytest.mark.parametrize("model_type", arch_matrix.architectures())
def test_architecture(model_type):
    outcome = _outcome(model_type)
    assert _documented().get(model_type) == arch_matrix.documented(outcome), STALE
    if outcome.status == "not built":
        pytest.skip(outcome.reason)
    assert outcome.status in ("supported", "refused")
    if outcome.status == "refused":  # the error names the model class and says why speculation cannot be exact
        named = outcome.reason.split()[0].removesuffix("'s")
        assert named.endswith(("ForCausalLM", "LMHeadModel", "Model")), outcome.reason
        assert any(w in outcome.reason for w in ("cannot", "not match", "needs", "could not", "no ")), outcome.reason


def test_the_matrix_covers_the_common_families():
    """Not a name list to pass: a floor, so a harness regression that stops building models cannot go unnoticed."""
    for model_type in ("llama", "qwen3", "mistral", "gemma3_text", "gemma4_text", "olmo3", "bloom", "gpt2"):
        assert _outcome(model_type).status == "supported", _outcome(model_type)
    for model_type in ("mamba", "qwen3_next", "rwkv"):
        assert _outcome(model_type).status == "refused", _outcome(model_type)


def test_docs_list_is_the_matrix():
    """The doc holds one row per architecture, in render's own form (counts, sections, transformers' version); each
    row is checked against its architecture's run by test_architecture."""
    doc = (ROOT / arch_matrix.DOC).read_text()
    rows = _documented()
    assert sorted(rows) == arch_matrix.architectures(), STALE
    assert doc == arch_matrix.render(list(rows.values())), STALE


# ---- crashes these architectures used to hit, one regression each (the matrix above runs them too) -------------


def test_target_without_max_position_embeddings():
    model = arch_matrix.build("bloom")
    assert not hasattr(model.config, "max_position_embeddings")
    drafter = DSparkDrafter.from_target(model, block_size=4, num_hidden_layers=1, markov_rank=8)
    plain = arch_matrix.greedy(model, PROMPT)
    with oracle_drafts(plain):
        assert arch_matrix.greedy(model, PROMPT, assistant_model=drafter).tolist() == plain.tolist()
    assert measure_profile(model, drafter, cache_len=32, warmup=0, repeats=1).cache_len == 32


@pytest.mark.parametrize("with_ids", [False, True], ids=["embeds-only", "embeds-and-ids"])
def test_inputs_embeds_prompt_is_exact(llama, with_ids):
    drafter = DSparkDrafter.from_target(llama, block_size=4, target_layer_ids=[0, 2], markov_rank=8)
    # every round drafts: under "auto" the draft gate follows a profile measured on this machine, and on a loaded
    # one it may skip drafting altogether, leaving nothing for the assertions below to check
    drafter.options.verify_policy = "all"
    embeds = llama.get_input_embeddings()(PROMPT)
    ids = dict(input_ids=PROMPT) if with_ids else {}
    plain = llama.generate(inputs_embeds=embeds, **ids, do_sample=False, max_new_tokens=30)
    assert plain.tolist() == llama.generate(PROMPT, do_sample=False, max_new_tokens=30)[:, -plain.shape[1]:].tolist()
    drafter.options.ngram_drafts = True
    with oracle_drafts(plain):  # plain is in input_ids' coordinates (no prompt ids when embeds-only), as drafts are
        spec = llama.generate(inputs_embeds=embeds, **ids, do_sample=False, max_new_tokens=30, assistant_model=drafter)
    assert spec.tolist() == plain.tolist()
    assert drafter.last_stats.drafted_rounds > 0 and max(r.accepted for r in drafter.last_stats.rounds) > 0
