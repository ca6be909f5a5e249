"""dspark_kernels: Triton kernels for the DSpark drafter's hot path (import name chosen so it never clashes
with the PyPI package `kernels`; the folder `kernels/` has no __init__.py on purpose).

- `markov_draft`: the whole sequential Markov-head draft of one round (γ positions) in γ+1 launches.
- `context_fusion`: fc projection of the concatenated taps + RMSNorm in 2 launches.
- `reference`: the PyTorch specification both kernels are tested against (explicit uniforms for sampling).
- `dispatch`: what hf_dspark calls: whether kernels run (HF_DSPARK_KERNELS) and their lazy entry points.

Tensors in, tensors out: nothing here imports hf_dspark.

Nothing here imports triton at import time: CPU-only installs import this package freely.
"""

from .dispatch import backend, triton_available, use_kernels

__all__ = ["backend", "triton_available", "use_kernels"]
