"""hf_dspark: DSpark speculative decoding for Hugging Face transformers.

    from hf_dspark import load_default_drafter, load_default_target
    model, tok = load_default_target()
    drafter = load_default_drafter(model)          # or DSparkDrafter.from_pretrained(path, target=model)
    prepare(model, drafter)                        # optional, once per machine (minutes): DSpark's compiled loop
    out = model.generate(**inputs, assistant_model=drafter, max_new_tokens=256)
    print(drafter.last_stats)

Names load on first use (so `hf-dspark --help` does not import torch).
"""

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "DSparkCandidateGenerator": ".decoding.candidate",
    "DSparkConfig": ".model.config",
    "DSparkDrafter": ".decoding.assistant",
    "DSparkDraftModel": ".model.drafter",
    "DSparkLogitsProcessor": ".decoding.processors",
    "DSparkStats": ".decoding.stats",
    "DecodingOptions": ".decoding.options",
    "enable": ".decoding.routing",
    "load_default_drafter": ".io.loading",
    "load_default_target": ".io.loading",
    "mark_stateless": ".decoding.processors",
    "prepare": ".decoding.profile",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'hf_dspark' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
