"""Which implementation runs: the Triton kernels or hf_dspark's PyTorch reference.

HF_DSPARK_KERNELS (read at every call, so tests and users can flip it at any time):
  auto   (default) kernels on CUDA tensors when triton imports; the PyTorch reference everywhere else;
  triton kernels on any device (CPU tensors need TRITON_INTERPRET=1, set before the first draft);
  torch  always the PyTorch reference.
Even when forced, a draft whose settings the kernel does not implement (another head type, logits processors
other than temperature and top-k, ...) runs the reference: the tokens must be drawn from exactly the logits
handed to transformers' rejection sampler, and only the reference applies arbitrary processors.
"""

from __future__ import annotations

import functools
import math
import os
import warnings

import torch

ENV = "HF_DSPARK_KERNELS"
BACKENDS = ("auto", "triton", "torch")
MAX_TOP_K = 256  # the kernel keeps next_pow2(top_k) candidates per vocabulary block (and sorts them)


def backend() -> str:
    value = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if value not in BACKENDS:
        raise ValueError(f"{ENV}={value!r}: expected one of {', '.join(BACKENDS)}")
    return value


@functools.cache
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def use_kernels(t: torch.Tensor) -> bool:
    """Whether this call should run a kernel, for a call whose main input is `t`."""
    chosen = backend()
    if chosen == "torch":
        return False
    if chosen == "auto":
        return t.is_cuda and triton_available()
    if not triton_available():
        raise ImportError(f"{ENV}=triton but triton is not installed (pip install 'hf-dspark[cuda]')")
    if not t.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(f"{ENV}=triton on {t.device} tensors needs Triton's interpreter: set TRITON_INTERPRET=1")
    return True


@functools.cache
def _warn_once(reason: str) -> None:
    warnings.warn(f"{ENV}=triton: the drafter runs the PyTorch reference here ({reason})", stacklevel=3)


def draft_plan(head, confidence, processor) -> dict | str:
    """The kernel's settings {temperature, top_k} for a draft, or a string saying why the reference must run."""
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper

    from hf_dspark.model.heads import ConfidenceHead, MarkovHead

    if head is not None and type(head) is not MarkovHead:
        return f"head {type(head).__name__}"
    if confidence is not None and (type(confidence) is not ConfidenceHead or confidence.proj.out_features != 1):
        return f"confidence head {type(confidence).__name__}"
    temperature = top_k = None
    if processor is not None and not isinstance(processor, list):
        return f"logits processor {type(processor).__name__}"
    for p in processor or ():
        # transformers' order: temperature, then top-k; anything else (penalties, top-p, ...) needs the reference
        if type(p) is TemperatureLogitsWarper and temperature is None and top_k is None:
            temperature = float(p.temperature)
        elif type(p) is TopKLogitsWarper and top_k is None and p.filter_value == -math.inf and p.top_k <= MAX_TOP_K:
            top_k = int(p.top_k)
        else:
            return f"logits processor {type(p).__name__}"
    return {"temperature": temperature, "top_k": top_k}


def sequential_draft(base_logits, hidden, anchor, head, confidence, prefix_ids, processor, do_sample,
                     vocab=None, w2=None, vocab_size=None):
    """Drop-in for hf_dspark.heads.sequential_draft (same arguments, same DraftBlock): the fused Markov draft
    when `use_kernels`, else the reference. Sampling draws Gumbel noise from torch's generator: a different
    stream than the reference's one uniform per token (heads.draw), the same distribution, and the returned logits are exactly the
    ones sampled from."""
    from hf_dspark.model.heads import DraftBlock
    from hf_dspark.model.heads import sequential_draft as reference

    args = (base_logits, hidden, anchor, head, confidence, prefix_ids, processor, do_sample)
    if not use_kernels(base_logits):
        return reference(*args, vocab=vocab, w2=w2, vocab_size=vocab_size)
    plan = draft_plan(head, confidence, processor)
    if isinstance(plan, str):
        if backend() == "triton":
            _warn_once(plan)
        return reference(*args, vocab=vocab, w2=w2, vocab_size=vocab_size)
    from .markov_draft import markov_draft

    n, vd = base_logits.shape
    w1 = head.W1.weight if head is not None else None
    if head is not None and w2 is None:
        w2 = head.W2.weight
    conf_w = conf_b = None
    if confidence is not None:
        proj = confidence.proj
        conf_w = proj.weight.reshape(-1)
        conf_b = proj.bias if proj.bias is not None else conf_w.new_zeros(1)
    uniforms = torch.rand(n, vd, device=base_logits.device) if do_sample else None
    tokens, logits, conf = markov_draft(
        base_logits, anchor, w1, w2 if head is not None else None, hidden, conf_w, conf_b, vocab,
        vocab_size or vd, uniforms=uniforms, **plan,
    )
    return DraftBlock(tokens, logits, conf if conf is not None else torch.zeros(n))


def fuse_context(features: torch.Tensor, fc: torch.nn.Linear, norm: torch.nn.Module) -> torch.Tensor:
    """features [B, n, m·d] → norm(fc(features)) [B, n, d]: the fused kernel for a bias-free fc followed by a
    LlamaRMSNorm, else the modules themselves."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    if use_kernels(features) and fc.bias is None and type(norm) is LlamaRMSNorm:
        from .context_fusion import context_fusion

        return context_fusion(features, fc.weight, norm.weight, norm.variance_epsilon)
    return norm(fc(features.to(fc.weight.dtype)))
