"""kernels/dspark_kernels against their PyTorch references. Without CUDA the kernels run in Triton's CPU
interpreter: run `TRITON_INTERPRET=1 pytest tests/model/test_kernels.py` (Triton reads it when first imported, and
tests/conftest.py imports it through transformers); shapes stay tiny because the interpreter is slow.
The same file runs compiled on a GPU (scripts/gpu_check.sh)."""

import os
import sys
from pathlib import Path

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")
_KERNELS = Path(__file__).resolve().parents[2] / "kernels"
if str(_KERNELS) not in sys.path:  # a checkout whose install predates kernels/ (pyproject should list it)
    sys.path.insert(0, str(_KERNELS))

tl = pytest.importorskip("triton.language", reason="triton is not installed (pip install triton: its CPU "
                         "interpreter suffices)")
if DEVICE == "cpu" and type(tl.zeros).__name__ != "InterpretedFunction":
    # Triton fixes interpreter vs compiler when it is imported, and `from transformers import LlamaForCausalLM`
    # (tests/conftest.py) imports it: the interpreter must be switched on before pytest starts.
    pytest.skip("no GPU and triton was imported without its interpreter: run TRITON_INTERPRET=1 pytest ...",
                allow_module_level=True)

from dspark_kernels import dispatch, reference
from dspark_kernels.context_fusion import context_fusion
from dspark_kernels.markov_draft import markov_draft
from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from hf_dspark import DSparkDrafter
from hf_dspark.decoding.options import DecodingOptions
from hf_dspark.model import drafter as drafter_mod
from hf_dspark.model import heads
from tests.conftest import tiny_target


def _draft_inputs(seed, n, V, vd, r, d, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    vocab = None if vd == V else torch.randperm(V, generator=g)[:vd].sort().values
    U = torch.randn(n, vd, generator=g) * 2
    w1, w2 = torch.randn(V, r, generator=g).to(dtype), torch.randn(vd, r, generator=g).to(dtype)
    h = torch.randn(n, d, generator=g).to(dtype)
    to = lambda t: None if t is None else t.to(DEVICE)
    return to(U), to(vocab), to(w1), to(w2), to(h)


# (V, V', r, d, block_v, head, conf with W1[prev], temperature, top_k): odd sizes, several blocks, one block,
# pruned vocabulary, top-k above / below V' and across blocks
CASES = [
    (37, 37, 5, 8, 16, True, True, None, None),
    (53, 19, 6, 8, 16, True, True, 0.7, None),
    (29, 29, 3, 5, 64, True, False, None, None),
    (37, 37, 5, 8, 16, False, False, 1.3, None),
    (41, 41, 4, 8, 16, True, True, 0.5, 5),
    (53, 19, 6, 8, 16, True, True, None, 30),
    (53, 19, 6, 8, 16, True, True, None, 7),
    (37, 37, 5, 8, 16, True, True, None, 1),
]


@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "sample"])
@pytest.mark.parametrize("case", CASES, ids=[f"V{c[0]}-Vd{c[1]}-b{c[4]}-T{c[7]}-k{c[8]}" for c in CASES])
def test_markov_draft_matches_reference(case, sample):
    V, vd, r, d, block_v, head, conf_emb, temperature, top_k = case
    n = 4
    U, vocab, w1, w2, h = _draft_inputs(V + vd, n, V, vd, r, d)
    if not head:
        w1 = w2 = None
    g = torch.Generator().manual_seed(7)
    cw = torch.randn(d + (r if conf_emb else 0), generator=g).to(DEVICE)
    cb = torch.randn(1, generator=g).to(DEVICE)
    u = torch.rand(n, vd, generator=g).to(DEVICE) if sample else None
    anchor = torch.tensor(3, device=DEVICE)
    tk, lk, ck = markov_draft(U, anchor, w1, w2, h, cw, cb, vocab, V, temperature, top_k, u, block_v=block_v)
    tr, lr, emb = reference.markov_draft(U, anchor, w1, w2, vocab, V, temperature, top_k, u)
    assert tk.tolist() == tr.tolist()  # identical argmax / identical samples for identical uniforms
    assert torch.equal(torch.isinf(lk), torch.isinf(lr))  # same support: q is 0 exactly where it should be
    torch.testing.assert_close(lk, lr, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ck, reference.confidence_logits(h, emb, cw, cb), atol=1e-5, rtol=1e-5)


def test_markov_draft_bf16_weights():
    """bf16 drafter weights: the bias is rounded to bf16 as the reference's matmul output is."""
    U, _, w1, w2, _ = _draft_inputs(0, 3, 45, 45, 8, 8, dtype=torch.bfloat16)
    tk, lk, _ = markov_draft(U, torch.tensor(1, device=DEVICE), w1, w2, block_v=16)
    tr, lr, _ = reference.markov_draft(U, torch.tensor(1, device=DEVICE), w1, w2)
    assert tk.tolist() == tr.tolist()
    torch.testing.assert_close(lk, lr, atol=6e-2, rtol=1e-2)  # one bf16 ulp of the bias (|B| < 16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("M, m, dim", [(1, 1, 16), (5, 3, 24), (19, 2, 40)])
def test_context_fusion_matches_reference(M, m, dim, dtype):
    g = torch.Generator().manual_seed(M)
    x = torch.randn(1, M, m * dim, generator=g).to(DEVICE, dtype)
    fw = (torch.randn(dim, m * dim, generator=g) / (m * dim) ** 0.5).to(DEVICE, dtype)
    nw = torch.randn(dim, generator=g).to(DEVICE, dtype)
    out = context_fusion(x, fw, nw, 1e-6)
    ref = reference.context_fusion(x, fw, nw, 1e-6)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)


# ---- dispatch ----------------------------------------------------------------------------------------------


def tiny_pair(head="markov", vocab=None):
    model = tiny_target(vocab=48, hidden=16, layers=3, heads=2, kv_heads=1, seed=0, logit_scale=4.0).to(DEVICE)
    torch.manual_seed(1)
    dr = DSparkDrafter.from_target(model, block_size=4, target_layer_ids=[0, 1], head_type=head, markov_rank=4)
    dr.options = DecodingOptions("all", ngram_drafts=False)  # every round goes through the draft kernels
    if vocab is not None:
        dr.set_draft_vocab(vocab)
    with torch.no_grad():  # a strong Markov bias, so a wrong bias would change tokens
        for p in (dr.markov_head.parameters() if dr.markov_head is not None else ()):
            p.normal_(0.0, 1.0)
    return model, dr


def test_kernel_plan_names_what_forces_the_reference():
    _, dr = tiny_pair()
    assert heads.kernel_plan(dr.markov_head, dr.confidence_head, None) == {"temperature": None, "top_k": None}
    procs = LogitsProcessorList([TemperatureLogitsWarper(0.7), TopKLogitsWarper(5)])
    assert heads.kernel_plan(dr.markov_head, dr.confidence_head, procs) == {"temperature": 0.7, "top_k": 5}
    assert "TopPLogitsWarper" in heads.kernel_plan(dr.markov_head, dr.confidence_head, LogitsProcessorList([TopPLogitsWarper(0.9)]))
    assert "TemperatureLogitsWarper" in heads.kernel_plan(  # top-k then temperature is not transformers' order
        dr.markov_head, dr.confidence_head, LogitsProcessorList([TopKLogitsWarper(5), TemperatureLogitsWarper(0.7)]))
    assert "TopKLogitsWarper" in heads.kernel_plan(dr.markov_head, dr.confidence_head, LogitsProcessorList([TopKLogitsWarper(999)]))
    _, rnn = tiny_pair("rnn")
    assert "RNNHead" in heads.kernel_plan(rnn.markov_head, rnn.confidence_head, None)


def test_backend_env(monkeypatch):
    t = torch.zeros(1, device=DEVICE)
    monkeypatch.setenv(dispatch.ENV, "torch")
    assert not dispatch.use_kernels(t)
    monkeypatch.setenv(dispatch.ENV, "triton")
    assert dispatch.use_kernels(t)
    monkeypatch.setenv(dispatch.ENV, "auto")
    assert dispatch.use_kernels(t) == (DEVICE == "cuda")
    monkeypatch.setenv(dispatch.ENV, "cuda")
    with pytest.raises(ValueError, match="auto, triton, torch"):
        dispatch.use_kernels(t)


def test_hf_dspark_is_wired_to_the_dispatch():
    """Fails when dspark_kernels was not importable as hf_dspark loaded: pyproject must list kernels/ (docs/kernels.md)."""
    assert heads.kernels is dispatch


@pytest.fixture
def kernel_path(monkeypatch):
    """Force the kernels and count their launches through the dispatch (wired as hf_dspark would be)."""
    from dspark_kernels import context_fusion as cf_mod
    from dspark_kernels import markov_draft as md_mod

    monkeypatch.setenv(dispatch.ENV, "triton")
    calls = {"draft": 0, "fusion": 0}

    def count(name, fn):
        def wrapped(*a, **k):
            calls[name] += 1
            return fn(*a, **k)
        return wrapped

    monkeypatch.setattr(md_mod, "markov_draft", count("draft", md_mod.markov_draft))
    monkeypatch.setattr(cf_mod, "context_fusion", count("fusion", cf_mod.context_fusion))
    return calls


def test_dispatch_draft_equals_reference(kernel_path):
    """The drafter's own inputs through both paths: same greedy tokens, same logits and confidences."""
    _, dr = tiny_pair(vocab=list(range(0, 48, 3)))
    g = torch.Generator().manual_seed(3)
    h = torch.randn(4, 16, generator=g).to(DEVICE)
    vocab, lm_rows, w2 = dr.draft_weights()
    base = dr.base_logits(h, lm_rows)
    prefix = torch.tensor([[5, 6, 9]], device=DEVICE)
    args = (base, h, torch.tensor(9, device=DEVICE), dr.markov_head, dr.confidence_head, prefix, None, False)
    with torch.no_grad():
        got = heads.draft_block(*args, vocab=vocab, w2=w2, vocab_size=48, backend="triton")
        want = heads.sequential_draft(*args, vocab=vocab, w2=w2, vocab_size=48)
    assert kernel_path["draft"] == 1
    assert got.tokens.tolist() == want.tokens.tolist()
    torch.testing.assert_close(got.logits, want.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.conf_logits.cpu(), want.conf_logits.cpu(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("vocab", [None, list(range(0, 48, 2))], ids=["full-vocab", "pruned-vocab"])
def test_end_to_end_greedy_identity_on_the_kernel_path(kernel_path, vocab):
    model, dr = tiny_pair(vocab=vocab)
    prompt = torch.tensor([[1, 5, 2, 7]], device=DEVICE)
    plain = model.generate(prompt, do_sample=False, max_new_tokens=10)
    spec = model.generate(prompt, do_sample=False, max_new_tokens=10, assistant_model=dr)
    assert spec.tolist() == plain.tolist()
    assert kernel_path["draft"] == sum(r.drafted > 0 for r in dr.last_stats.rounds) > 0
    assert kernel_path["fusion"] > 0


def test_end_to_end_sampling_runs_on_the_kernel_path(kernel_path, monkeypatch):
    """Temperature + top-k (transformers' defaults when sampling): the kernel drafts, and every drafted token
    has q > 0 in the logits handed to the verifier."""
    model, dr = tiny_pair()
    seen = []
    real = drafter_mod.draft_block

    def spy(*a, **k):
        block = real(*a, **k)
        seen.append(block)
        return block

    monkeypatch.setattr(drafter_mod, "draft_block", spy)
    torch.manual_seed(0)
    out = model.generate(torch.tensor([[1, 5, 2]], device=DEVICE), do_sample=True, temperature=0.8, top_k=6,
                         max_new_tokens=8, min_new_tokens=8, assistant_model=dr)
    assert out.shape[1] == 11 and kernel_path["draft"] == len(seen) > 0
    for b in seen:
        q = torch.softmax(b.logits, -1)
        assert bool((q.gather(1, b.tokens.view(-1, 1)) > 0).all())
        assert bool((torch.isfinite(b.logits).sum(-1) <= 6).all())  # top-k masked in q itself


@pytest.mark.skipif(DEVICE == "cpu" and not os.environ.get("HF_DSPARK_SLOW"),
                    reason="~11 min in Triton's CPU interpreter: runs on a GPU (scripts/gpu_check.sh) or with HF_DSPARK_SLOW=1")
def test_sampling_exactness_on_the_kernel_path(kernel_path):
    """tests/decoding/test_sampling.py's G-test with the kernels drafting (slow in the interpreter; seconds on a GPU)."""
    pytest.importorskip("scipy")
    from tests.sampling_check import ALPHA, PROMPT, exact_distribution, fit_pvalue, processors, sample_counts, setup

    model, dr = setup(head="markov")
    exact = exact_distribution(model, PROMPT, 5, processors(temperature=0.7, top_k=4))
    model.to(DEVICE)
    dr.to(DEVICE)
    samples = sample_counts(model, dr, PROMPT.to(DEVICE), 5, 600, seed=123, temperature=0.7, top_k=4)
    assert kernel_path["draft"] > 0
    assert fit_pvalue(samples, exact) >= ALPHA
