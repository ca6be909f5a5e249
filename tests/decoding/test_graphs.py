"""The compiled loop's saved graphs (decoding/graphs.py): a graph keeps only tensor guards, so its key must change
with everything else it was traced under, and only with that (loading and compiling: tests/decoding/test_loop.py)."""

import torch
from transformers import LlamaForCausalLM

from hf_dspark.decoding import loop, machine
from hf_dspark.decoding.graphs import VerificationGraphs, graph_key, graph_path, linear_forms, plain_class
from hf_dspark.decoding.linears import WeightMajorLinears
from hf_dspark.decoding.routing import enable
from tests.conftest import tiny_target
from tests.decoding.test_machine import ZEN4


def _path(model, length=100, taps=(1, 3)):
    model.__dict__.pop("_dspark_static_cache", None)  # a cache of `length` + 1 rounded up, not a longer one kept
    return graph_path(graph_key(model, loop._static_cache(model, length), list(taps), 8))


def test_the_key_changes_with_what_a_graph_was_traced_under():
    """...and not with the weights or the size of a cache of full-attention layers (a sliding window's layer keeps
    its size in the key: test_a_sliding_window_layer_keeps_its_size_in_the_key)."""
    model = tiny_target()
    base = _path(model)
    assert _path(tiny_target(seed=1)) == base  # another checkpoint of the same config: weights are inputs
    assert _path(model, length=600) == base  # full-attention layers: one graph for every cache size
    assert _path(model, taps=(1, 2)) != base  # the hidden states tapped
    with WeightMajorLinears(model, max_rows=8):
        assert _path(model) != base  # the products the linear layers run
    assert _path(model) == base
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(before + 1)
        assert _path(model) != base  # the kernels are built for a thread count
    finally:
        torch.set_num_threads(before)
    other = tiny_target()
    other.config.rope_parameters = {**other.config.rope_parameters, "rope_theta": 500.0}
    assert _path(other) != base  # a constant of the config
    assert _path(tiny_target().to(torch.bfloat16)) != base
    assert _path(tiny_target("qwen3")) != base


def test_a_graph_built_on_another_cpu_of_the_same_name_is_another_graph(monkeypatch):
    """inductor builds a graph's kernels for the CPU it runs on: one more ISA flag is another graph."""
    model, paths = tiny_target(), []
    for text in (ZEN4, ZEN4.replace("avx2 fma", "avx2 gfni fma")):
        monkeypatch.setattr(machine, "read_cpuinfo", lambda text=text: text)
        paths.append(_path(model))
    assert paths[0] != paths[1]
    assert graph_key(model, loop._static_cache(model, 8), None, 8)["cpu"].startswith("AMD EPYC | AuthenticAMD")


def test_forms_and_the_class_a_graph_records():
    model = tiny_target()
    assert set(linear_forms(model)) == {"stock"}
    with WeightMajorLinears(model, max_rows=8):
        assert {form.rsplit(":", 1)[1] for form in linear_forms(model)} == {"8"}
    enable(model)
    assert type(model) is not LlamaForCausalLM and plain_class(model) is LlamaForCausalLM


def test_a_sliding_window_layer_keeps_its_size_in_the_key():
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    model = MistralForCausalLM(MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=2, sliding_window=1024,
                                             max_position_embeddings=4096)).eval()
    kinds = {type(layer).__name__ for layer in loop._static_cache(model, 100).layers}
    assert kinds == {"StaticSlidingWindowLayer"}
    assert _path(model, length=100) != _path(model, length=600)  # min(window, size) is the layer's size
    assert _path(model, length=1500) == _path(model, length=2000)  # both the window's 1,024


def test_a_graph_that_cannot_be_saved_still_serves_this_process(tmp_path, monkeypatch, caplog):
    """Saving fails (a full disk, an object the pickler refuses): a warning, no failure recorded, no file left, and
    the compiled graph serves this process's calls (compiled once)."""
    monkeypatch.setenv("HF_DSPARK_CACHE", str(tmp_path))
    compiled = []

    class Graph:  # stands in for an AOT-compiled function: the eager forward
        def __call__(self, model, tokens, cache, taps):
            out = model(tokens, cache=cache, use_cache=True, output_hidden_states=taps)
            return out.logits, out.hidden_states

        def save_compiled_function(self, path):
            raise OSError("No space left on device")

    class Compile:
        def __init__(self, fn, **kwargs):
            pass

        def aot_compile(self, example_inputs):
            compiled.append(1)
            return Graph()

    monkeypatch.setattr(torch, "compile", Compile)
    model = tiny_target()
    cache = loop._static_cache(model, 100)
    ids = torch.randint(3, 60, (1, 12), generator=torch.Generator().manual_seed(0))
    model(ids, cache=cache, use_cache=True)
    graphs = VerificationGraphs(model, 8, 64)
    for _ in range(2):
        out = graphs(ids[:, :4], cache=cache, output_hidden_states=None)
        assert out.logits.shape == (1, 4, 64)
        cache.crop(-4)
    assert compiled == [1] and "could not save the compiled graph" in caplog.text
    assert not any((tmp_path / "graphs").iterdir())


def test_the_isa_probe_is_off_only_inside_the_lookup_and_stays_on_with_other_inductor_internals(monkeypatch):
    """Inside, inductor takes the CPU's ISAs as built (its probe off) and its per-process ISA list is dropped on
    leaving; a torch whose ISA list is not a per-process cache keeps the probe (a lookup probes, as inductor does)."""
    from torch._inductor import config, cpu_vec_isa

    from hf_dspark.decoding.graphs import _isa_unprobed

    before = config.cpp.vec_isa_ok
    with _isa_unprobed():
        assert config.cpp.vec_isa_ok is True
        cpu_vec_isa.valid_vec_isa_list()
        assert cpu_vec_isa.valid_vec_isa_list.cache_info().currsize == 1
    assert config.cpp.vec_isa_ok == before and cpu_vec_isa.valid_vec_isa_list.cache_info().currsize == 0
    monkeypatch.setattr(cpu_vec_isa, "valid_vec_isa_list", list)  # not a functools cache
    with _isa_unprobed():
        assert config.cpp.vec_isa_ok == before
