"""Whether the Triton kernels run, and the kernels' entry points (tensors in, tensors out; triton is imported
only when a kernel first runs). Which drafts qualify is hf_dspark's decision (hf_dspark/model/heads.py).

HF_DSPARK_KERNELS (read at every call, so tests and users can flip it at any time):
  auto   (default) kernels on CUDA tensors when triton imports; the PyTorch reference everywhere else;
  triton kernels on any device (CPU tensors need TRITON_INTERPRET=1, set before the first draft);
  torch  always the PyTorch reference.
Even when forced, a draft whose settings the kernel does not implement (another head type, logits processors
other than temperature and top-k, ...) runs the reference: the tokens must be drawn from exactly the logits
handed to the rejection sampler, and only the reference applies arbitrary processors.
"""

from __future__ import annotations

import functools
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


def use_kernels(t: torch.Tensor, choice: str | None = None) -> bool:
    """Whether this call should run a kernel, for a call whose main input is `t`: `choice` (one of BACKENDS),
    else HF_DSPARK_KERNELS."""
    if choice is not None and choice not in BACKENDS:
        raise ValueError(f"backend {choice!r}: expected one of {', '.join(BACKENDS)}")
    chosen = backend() if choice is None else choice
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
def warn_once(reason: str) -> None:
    """Say once per reason that HF_DSPARK_KERNELS=triton was overruled (the caller's draft runs the reference)."""
    warnings.warn(f"{ENV}=triton: the drafter runs the PyTorch reference here ({reason})", stacklevel=3)


def markov_draft(*args, **kwargs):
    """markov_draft.markov_draft, imported (with triton) on the first call."""
    from . import markov_draft as kernel

    return kernel.markov_draft(*args, **kwargs)


def context_fusion(*args, **kwargs):
    """context_fusion.context_fusion, imported (with triton) on the first call."""
    from . import context_fusion as kernel

    return kernel.context_fusion(*args, **kwargs)
