"""The compiled loop's verification forward: compiled ahead of time once per setup, kept on disk, loaded in seconds.

`torch.compile` traces the target's forward again in every process: about 30 s for SmolLM2-135M on a CPU even with
its kernels cached, two to three minutes the first time. Here the forward is compiled ahead of time (torch's AOT
precompile, `aot_compile`) into one graph whose token count, attended window (loop.WindowedLayer) and cache size are
symbolic, saved under the storage folder (`graphs/`, inductor's kernels for it in `inductor/`), and loaded by later
processes instead of traced: 3 s for SmolLM2-135M on a Zen 1 EPYC (research/record/benchmarks.md).

A saved graph keeps only its tensor guards (shapes, dtypes, strides; torch.compiler.keep_portable_guards_unsafe), so
everything else it was traced under is in its key (`graph_key`), and a graph is loaded only for that setup: the
target's class and config, dtype, device, the CPU and the vector ISA its kernels were built for, torch's thread
count (its kernels are built for it), torch / transformers / hf_dspark versions, the cache's layer kinds (and the
size of a sliding-window layer; a windowed layer's size is symbolic), the hidden states tapped, and the products the
target's linear layers run (linears.py). The weights are inputs, read at every call: another checkpoint of the same
config loads the same graph.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import platform
import sys
import time
import weakref
from pathlib import Path

import torch
import transformers
from torch import nn
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.utils import logging

from ..storage import storage_dir, write_atomic
from .machine import cpu_identity

logger = logging.get_logger(__name__)

GRAPH_VERSION = 1  # bump when what the traced function computes changes
MAX_CACHE = 1 << 20  # the longest cache a graph serves


def _forward(model, tokens: torch.Tensor, cache, taps):
    """The traced function: module-level, so a saved graph names it by import path; the model is an argument, so
    its weights are inputs."""
    out = model(tokens, cache=cache, use_cache=True, output_hidden_states=taps)
    return out.logits, out.hidden_states


def plain_class(model: nn.Module) -> type:
    """The first importable nn.Module class of `model`: its own, or the one routing.enable derived its class from
    (a saved graph records the class by import path, and the derived one has none)."""
    for cls in type(model).__mro__:
        if issubclass(cls, nn.Module) and getattr(sys.modules.get(cls.__module__), cls.__qualname__, None) is cls:
            return cls
    raise TypeError(f"{type(model).__name__} has no importable class")


def _installed(linear: nn.Linear):
    """The function installed as `linear`'s instance forward (linears.py), None for nn.Linear's own."""
    f = linear.__dict__.get("forward")
    return getattr(f, "__func__", f)


def linear_forms(model: nn.Module) -> list[str]:
    """What each nn.Linear of `model` runs: "stock", or the instance forward installed on it (linears.py's
    weight-major form names its row limit)."""
    forms = [_installed(m) for m in model.modules() if isinstance(m, nn.Linear)]
    return ["stock" if f is None else f"{f.__qualname__}:{getattr(f, 'max_rows', '')}" for f in forms]


def graph_setup() -> dict:
    """What every saved graph of this machine and install depends on besides the model and the call: the graph
    format, the CPU its kernels were built for (cpu_identity: every ISA flag), the machine and the library versions.
    A compiled profile's key holds its digest (profile.profile_key), so that a new version or another CPU sharing
    the storage folder is a machine not yet set up rather than one whose next call compiles."""
    return {
        "version": GRAPH_VERSION,
        "cpu": cpu_identity(),
        "machine": platform.machine(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "hf_dspark": sys.modules["hf_dspark"].__version__,
    }


def graph_key(model, cache, taps, max_tokens: int) -> dict:
    """Everything a saved graph was traced under besides its tensors' shapes (module docstring)."""
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    cls = plain_class(model)
    config = model.config.to_dict()
    for k in ("_name_or_path", "transformers_version"):
        config.pop(k, None)
    device = torch.device(model.device)
    return {
        **graph_setup(),
        "class": f"{cls.__module__}.{cls.__qualname__}",
        "config": config,
        "attention": getattr(model.config, "_attn_implementation", None),
        "dtype": str(model.dtype),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else device.type,
        "isa": str(pick_vec_isa()) if device.type == "cpu" else "",
        "threads": torch.get_num_threads(),
        "cache": [(type(layer).__name__, None if _windowed(layer) else getattr(layer, "max_cache_len", None))
                  for layer in cache.layers],
        "taps": taps if isinstance(taps, (bool, type(None))) else list(taps),
        "linears": linear_forms(model),
        "max_tokens": max_tokens,
    }


def _windowed(layer) -> bool:
    """A cache layer whose forwards attend a window (loop.WindowedLayer): its size is symbolic in the graph."""
    return hasattr(type(layer), "window")


def _kernels():
    """A context in which inductor keeps its files (the kernels a graph's load builds or finds) beside the graphs,
    not in its default temporary folder: a wiped temporary folder (a reboot) would make the next load rebuild them
    (24 s instead of 3 s for SmolLM2 on a Zen 1 EPYC)."""
    from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir

    return temporary_cache_dir(str(storage_dir() / "inductor"))


@contextlib.contextmanager
def _isa_unprobed():
    """A context in which inductor takes every vector ISA the CPU reports as one its compiler builds, instead of
    probing each (it builds a test kernel per ISA and loads it in a child process: about 1 s at a process's first
    compiled call on a 2-core Xeon). Used only to find and load a graph saved on this machine: its key names the CPU
    (every flag) and the ISA the probe chose when it was compiled, so a graph found under the best ISA was built with
    it here. inductor caches its ISA list per process; it is dropped on leaving, so later compiles probe again."""
    from torch._inductor import config

    try:
        from torch._inductor.cpu_vec_isa import valid_vec_isa_list
        clear = valid_vec_isa_list.cache_clear
    except (ImportError, AttributeError):  # another torch's internals: look up with the probe, as inductor does
        clear = None
    if clear is None:
        yield
        return
    clear()
    try:
        with config.patch({"cpp.vec_isa_ok": True}):
            yield
    finally:
        clear()


def graph_path(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:20]
    return storage_dir() / "graphs" / f"{key['config'].get('model_type', 'model')}-{digest}.pt2"


class VerificationGraphs:
    """`model`'s verification forward, `forward(tokens, cache=..., use_cache=True, output_hidden_states=taps)` as
    model.forward is called, run by the graph of its setup: loaded from disk, else compiled and saved. The token
    count may be 2..max_tokens, the window (loop.WindowedLayer: a tensor's length) min_window..cache size - 1 and the
    windowed layers' size anything up to MAX_CACHE, in one graph. Returns CausalLMOutputWithPast(logits [1, L, V],
    hidden_states)."""

    def __init__(self, model, max_tokens: int, min_window: int):
        self._model = weakref.ref(model)  # loop.py keeps this object for the model's lifetime, keyed weakly by it
        self.max_tokens, self.min_window = max_tokens, min_window
        self.graphs: dict[Path, object] = {}
        self.seen: dict[tuple, object] = {}  # what changes between calls → its graph (a key costs ~16 ms to build)
        self.linears = [m for m in model.modules() if isinstance(m, nn.Linear)]

    @property
    def model(self):
        return self._model()

    def __call__(self, tokens: torch.Tensor, *, cache, use_cache: bool = True, output_hidden_states=None):
        forms = tuple(id(_installed(m)) for m in self.linears)
        seen = (id(cache), len(cache.layers), getattr(cache.layers[0], "max_cache_len", None),
                repr(output_hidden_states), torch.get_num_threads(), self.model.dtype, self.model.device, forms)
        graph = self.seen.get(seen)
        if graph is None:
            with _kernels():  # the key's vector-ISA probe builds a kernel too
                with _isa_unprobed():  # a graph saved here loads without the probe (_isa_unprobed)
                    path = graph_path(graph_key(self.model, cache, output_hidden_states, self.max_tokens))
                    tried = path if path.exists() else None
                    graph = self.graphs.get(path) or (self._load(path) if tried else None)
                if graph is None:  # none saved for the CPU's best vector ISA: probed, as inductor does
                    key = graph_key(self.model, cache, output_hidden_states, self.max_tokens)
                    path = graph_path(key)
                    graph = (self.graphs.get(path) or self._load(path, unreadable=path == tried)
                             or self._compile(path, key, tokens, cache, output_hidden_states))
                self.graphs[path] = graph
            self.seen[seen] = graph
        logits, hidden = graph(self.model, tokens, cache, output_hidden_states)
        return CausalLMOutputWithPast(logits=logits, hidden_states=hidden)

    def _load(self, path: Path, unreadable: bool = False):
        """The graph saved at `path`, or None (none saved, or `unreadable`: found so just before). Raises where
        compiling this setup failed before."""
        failed = path.with_suffix(".failed")
        if failed.exists():  # compiling this setup failed before (no compiler, an op it cannot take): not again
            raise RuntimeError(f"{failed.read_text().strip()} (recorded in {failed}; delete it to try again)")
        if unreadable or not path.exists():
            return None
        t0 = time.perf_counter()
        try:
            with open(path, "rb") as f:
                graph = torch.compiler.load_compiled_function(f)
        except Exception as e:  # noqa: BLE001 -- a truncated or foreign file: compile it again, overwrite it
            logger.warning(f"DSpark: could not load the compiled graph {path} ({type(e).__name__}: {e}); compiling "
                           "it again")
            return None
        logger.info(f"DSpark: loaded the compiled verification graph in {time.perf_counter() - t0:.1f} s")
        return graph

    def _compile(self, path: Path, key: dict, tokens: torch.Tensor, cache, taps):
        """Trace and compile on example inputs marked symbolic, then save the graph (atomically) and its key."""
        logger.warning("DSpark: compiling the target's verification forward (once per setup; a few minutes on a "
                       f"CPU), saved to {path}")
        t0 = time.perf_counter()
        tokens = tokens.clone()
        torch._dynamo.mark_dynamic(tokens, 1, min=2, max=self.max_tokens)
        windowed = [layer for layer in cache.layers if _windowed(layer)]
        for layer in windowed:  # every cache size in one graph: the window (≤ size - 1) is all a forward attends
            for t in (layer.keys, layer.values):
                torch._dynamo.mark_dynamic(t, 2, min=2 * self.min_window, max=MAX_CACHE)
        for window in {id(layer.window): layer.window for layer in windowed if layer.window is not None}.values():
            torch._dynamo.mark_dynamic(window, 0, min=self.min_window, max=MAX_CACHE - 1)
        model, derived = self.model, type(self.model)
        model.__class__ = plain_class(model)  # recorded by import path (plain_class); forward is the same
        try:
            try:
                graph = torch.compile(_forward, fullgraph=True,
                                      options={"guard_filter_fn": torch.compiler.keep_portable_guards_unsafe}
                                      ).aot_compile(((model, tokens, cache, taps), {}))
            except Exception as e:
                write_atomic(path.with_suffix(".failed"), f"{type(e).__name__}: {str(e).splitlines()[0][:300]}\n")
                raise
            logger.warning(f"DSpark: compiled in {time.perf_counter() - t0:.0f} s")
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                graph.save_compiled_function(str(path))  # atomic: a kill leaves no half file
            except Exception as e:  # noqa: BLE001 -- this process keeps the graph; the next compiles it again
                logger.warning(f"DSpark: could not save the compiled graph to {path} ({type(e).__name__}: {e})")
            else:
                write_atomic(path.with_suffix(".json"), json.dumps(key, indent=1, sort_keys=True, default=str))
        finally:
            model.__class__ = derived
        return graph
