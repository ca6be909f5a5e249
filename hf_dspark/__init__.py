"""hf_dspark: DSpark speculative decoding for Hugging Face transformers.

    from hf_dspark import DSparkDrafter, load_default_target
    model, tok = load_default_target()
    drafter = DSparkDrafter.from_pretrained(path, target=model)
    out = model.generate(**tok(prompt, return_tensors="pt"), assistant_model=drafter, max_new_tokens=256)
    print(drafter.last_stats)
"""

from transformers import AutoConfig

from .decoding.candidate import DSparkCandidateGenerator
from .decoding.options import DecodingOptions
from .decoding.processors import DSparkLogitsProcessor, mark_stateless
from .decoding.routing import enable
from .decoding.stats import DSparkStats
from .io.loading import load_default_drafter, load_default_target
from .model.config import DSparkConfig
from .model.drafter import DSparkDrafter

AutoConfig.register("dspark", DSparkConfig, exist_ok=True)

__version__ = "0.1.0"
__all__ = [
    "DSparkCandidateGenerator",
    "DSparkConfig",
    "DSparkDrafter",
    "DSparkLogitsProcessor",
    "DSparkStats",
    "DecodingOptions",
    "enable",
    "load_default_drafter",
    "load_default_target",
    "mark_stateless",
]
