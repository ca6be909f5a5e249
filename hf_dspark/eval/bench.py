"""`hf-dspark bench`: DSpark against what a transformers user already has, measured side by side.

Methods run in one process on the same prompts, interleaved prompt by prompt (the order rotates), so machine
drift hits all alike: plain `generate`, prompt lookup, the DFlash ablation drafter, DSpark with a fixed block,
DSpark with the prefix scheduler. Greedy outputs are checked token for token against plain decoding; in float32
any mismatch is a failure, reported loudly (exit code 1).

In bf16/fp16 a 1-token and an 8-token forward round differently, so greedy decoding can take the other side of a
near-tie (transformers' own prompt lookup does too). There a mismatch is judged by a *referee*, the target loaded
in float32 (referee.py): from the first difference on, every token must be within `tie_tolerance` logits of the
referee's best. Anything else is a failure, as in float32.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import transformers
from tqdm.auto import tqdm

from ..decoding.loop import reserve
from ..decoding.machine import cpu_info
from ..decoding.options import DecodingOptions
from ..decoding.stats import DSparkStats, Round
from ..io.prompts import chat_inputs, read_prompts
from ..training.data import is_holdout
from .referee import TIE_TOLERANCE, judge_divergence


@dataclass
class Method:
    """A way to generate: `extra` are generate() kwargs; `fresh(longest)` (optional) makes kwargs that must be new
    at every call (a static cache of `longest` = the longest prompt + max_new_tokens positions); `drafter`
    (optional) with its `policy`, and whether it takes n-gram drafts when it can (`ngram`:
    drafter.options.ngram_drafts)."""

    name: str
    extra: dict = field(default_factory=dict)
    drafter: object | None = None
    policy: object = "all"
    ngram: bool = False
    loop: str = "auto"  # DecodingOptions.loop of a DSpark method
    fresh: Callable[[int], dict] | None = None


def static_cache(model, base: Method | None = None, compiled: bool = True, mode: str = "default") -> Method:
    """`base` (default: plain generate) on a static KV cache, its forward compiled by torch.compile (transformers'
    speed recipe; its CompileConfig, allowed on every device) or, with compiled=False, eager. The cache is sized
    once for the whole benchmark, so each forward shape compiles once, on the warm-up calls (a DSpark method
    verifies 1..γ+1 tokens: one graph per length)."""
    from transformers import StaticCache
    from transformers.generation import CompileConfig

    base = base or Method("plain")
    if compiled:
        config = CompileConfig(dynamic=False, mode=mode)
        config._compile_all_devices = True  # transformers compiles on CUDA only unless told otherwise
        extra = {"compile_config": config}
    else:
        extra = {"disable_compile": True}
    return dataclasses.replace(
        base, name=f"{base.name}-static" + ("-compiled" if compiled else ""), extra={**base.extra, **extra},
        fresh=lambda longest: {"cache": StaticCache(config=model.config, max_cache_len=longest)})


def load_prompts(paths: list[str], limit: int | None, holdout: bool = False) -> list[tuple[str, str]]:
    """(dataset name, first user turn) from `{"turns": [...]}` JSONL files, the first `limit` of each; with
    `holdout`, only the prompts training never answers (training.data.is_holdout: 1 in 20 of a training file)."""
    out = []
    for path in paths:
        rows = [(key, text) for key, text in read_prompts(path) if not holdout or is_holdout(key)]
        out += [(Path(path).stem, text) for _, text in rows[:limit]]
    return out


def _environment(model) -> dict:
    cpu = cpu_info()  # two CPUs sold under one name differ here (family/model, avx512_bf16, AMX)
    return {
        "cpu": cpu["name"],
        "cpu_id": {k: cpu[k] for k in ("vendor", "family", "model", "flags")},
        "load": os.getloadavg()[0],  # > threads: other work competed for the cores
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "dtype": str(model.dtype).replace("torch.", ""),
        "device": str(model.device),
    }


def run_bench(model, tok, methods: list[Method], prompts: list[tuple[str, str]], max_new_tokens: int = 256,
              do_sample: bool = False, temperature: float = 1.0, seed: int = 980406, warmup: int = 1,
              check: Callable | None = None, referee=None, tie_tolerance: float = TIE_TOLERANCE) -> dict:
    """Run every method on every prompt (rotating order); return every number as a JSON-able dict.

    `check(method, prompt_index, output_ids)` may replace an output before the identity check (tests use it to
    corrupt one and prove the check fires). `referee` (for bf16/fp16 targets: a function returning the target in
    float32, called once, at the first mismatch) judges greedy mismatches (referee.judge_divergence); without one
    every mismatch is a failure."""
    referee_model = functools.cache(referee) if referee is not None else (lambda: None)
    base = methods[0].name
    gen = dict(max_new_tokens=max_new_tokens, do_sample=do_sample)
    if do_sample:
        gen["temperature"] = temperature
    encoded = [chat_inputs(tok, text, model.device)["input_ids"] for _, text in prompts]
    context = getattr(model.config.get_text_config(), "max_position_embeddings", None)
    for (dataset, _), ids in zip(prompts, encoded):  # before any method runs: no baseline may try it either
        if context is not None and ids.shape[1] + max_new_tokens > context:
            raise ValueError(f"a {dataset} prompt is {ids.shape[1]} tokens: with --max-new-tokens {max_new_tokens} it "
                             f"exceeds the target's context of {context}")

    longest = -(-(max(ids.shape[1] for ids in encoded) + max_new_tokens) // 256) * 256

    def one(m: Method, ids):
        kw = dict(gen, **m.extra, **(m.fresh(longest) if m.fresh else {}))
        if m.drafter is not None:
            kw.update(assistant_model=m.drafter, dspark_options=dataclasses.replace(
                m.drafter.options, verify_policy=m.policy, ngram_drafts=m.ngram, loop=m.loop))
        t0 = time.perf_counter()
        out = model.generate(ids, **kw)
        return out, time.perf_counter() - t0

    if any(_loop(model, m) not in ("assisted", None) for m in methods):
        reserve(model, longest)  # DSpark's own loops get one cache for the whole run too, as the static-cache peers
    first_calls: dict[str, float] = {}  # first-call costs (allocations, profile, compiling) stay out of the numbers
    for ids in encoded[:warmup]:
        for m in methods:
            first_calls[m.name] = first_calls.get(m.name, 0.0) + one(m, ids)[1]

    rows = []
    for i, ids in enumerate(tqdm(encoded, desc="bench prompts")):
        order = methods[i % len(methods):] + methods[: i % len(methods)]
        outs = {}
        for m in order:
            if do_sample:
                torch.manual_seed(seed + i)  # the protocol of the paper: reseed per sample
            out, secs = one(m, ids)
            if check is not None:
                out = check(m, i, out)
            st = m.drafter.last_stats if m.drafter is not None else None
            outs[m.name] = out
            rows.append({
                "prompt": i, "dataset": prompts[i][0], "method": m.name, "seconds": secs,
                "new_tokens": out.shape[1] - ids.shape[1], "tokens": out[0, ids.shape[1]:].tolist(),
                "rounds": [vars(r) for r in st.rounds] if st is not None else None,
                "loop": st.loop if st is not None else None,
            })
        if not do_sample:
            for name, out in outs.items():
                row = next(r for r in rows if r["prompt"] == i and r["method"] == name)
                row["identical"] = out.tolist() == outs[base].tolist()
                if not row["identical"]:
                    row["divergence"] = judge_divergence(outs[base], out, ids.shape[1], referee_model(), tie_tolerance)
    res = summarize(rows, methods, base, prompts, model, gen)
    res["warmup_seconds"] = first_calls
    res["profiles"] = {m.name: _profile_used(model, m) for m in methods if m.drafter is not None}
    if not do_sample:
        res["settings"]["identity"] = ({"referee": "float32", "tie_tolerance": tie_tolerance} if referee is not None
                                       else "token for token")
    return res


def _pooled_stats(rows: list[dict], block: int) -> dict:
    st = DSparkStats(block_size=block)
    for r in rows:
        st.rounds += [Round(**x) for x in r["rounds"]]
    return {"tau": st.tau, "rounds": len(st.rounds), "drafted_rounds": st.drafted_rounds,
            "ngram_rounds": st.ngram_rounds, "conditional_acceptance": st.conditional_acceptance,
            "acceptance_rate": st.acceptance_rate, "verify_lengths": st.verify_lengths,
            "draft_time_s": st.draft_time, "verify_time_s": st.verify_time}


def _loop(model, m: Method) -> str | None:
    """The loop a DSpark method runs on ("auto" resolved as generate resolves it); None for other methods."""
    if m.drafter is None:
        return None
    return dataclasses.replace(m.drafter.options, loop=m.loop).concrete(model, m.drafter).loop


def _profile_used(model, m: Method) -> dict | None:
    """The cached device profile of a DSpark method's drafter and loop (None: none is cached; static lengths and
    "all" do not read it): the curve, the drafter's round and the verification products (decoding/linears.py)."""
    try:
        p = dataclasses.replace(m.drafter.options, loop=m.loop).profile_for(model, m.drafter, measure=False)
    except FileNotFoundError:
        return None
    return {"verify_time": p.verify_time, "draft_time": p.draft_time, "sampled_draft_time": p.sampled_draft_time,
            "linear": p.linear, "linear_ab": p.linear_ab, "created": p.created}


def summarize(rows, methods, base, prompts, model, gen) -> dict:
    res = {"environment": _environment(model), "settings": gen, "prompts": len(prompts), "methods": {}, "rows": rows}
    datasets = sorted({d for d, _ in prompts})
    for m in methods:
        mine = [r for r in rows if r["method"] == m.name]
        entry = {}
        for scope in ["all"] + datasets:
            sel = [r for r in mine if scope == "all" or r["dataset"] == scope]
            base_sel = {r["prompt"]: r for r in rows if r["method"] == base and (scope == "all" or r["dataset"] == scope)}
            ratios = [(r["new_tokens"] / r["seconds"]) / (base_sel[r["prompt"]]["new_tokens"] / base_sel[r["prompt"]]["seconds"])
                      for r in sel]
            q = statistics.quantiles(ratios, n=20, method="inclusive") if len(ratios) >= 2 else [ratios[0]] * 19
            e = {
                "tokens_per_s": sum(r["new_tokens"] for r in sel) / sum(r["seconds"] for r in sel),
                "speedup_median": statistics.median(ratios), "speedup_p25": q[4], "speedup_p75": q[14],
                "speedup_p10": q[1], "speedup_worst": min(ratios), "speedup_per_prompt": ratios,
                "speedup_pooled": (sum(r["new_tokens"] for r in sel) / sum(r["seconds"] for r in sel))
                / (sum(b["new_tokens"] for b in base_sel.values()) / sum(b["seconds"] for b in base_sel.values())),
            }
            if m.drafter is not None:
                e.update(_pooled_stats(sel, m.drafter.config.block_size))
                e["loops"] = sorted({r["loop"] for r in sel})  # the loops that ran ("auto" resolved; fallbacks)
            if "identical" in (sel[0] if sel else {}):
                e["mismatches"] = [r["prompt"] for r in sel if not r["identical"]]
                e["near_ties"] = [r["prompt"] for r in sel if not r["identical"] and r["divergence"]["near_tie"]]
                e["off_argmax"] = sum(r["divergence"].get("off_argmax", 0) for r in sel if not r["identical"])
            entry[scope] = e
        res["methods"][m.name] = entry
    return res


def markdown_table(res: dict) -> str:
    lines = ["| method | dataset | tok/s | speedup per prompt: median (p25–p75) | p10 | worst | pooled speedup | τ | "
             "identical |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, entry in res["methods"].items():
        for scope, e in entry.items():
            if scope == "all" and len(entry) == 2:
                continue  # one dataset: its row says it all
            ident = "—" if "mismatches" not in e else identity_cell(e)
            tau = f"{e['tau']:.2f}" if "tau" in e else "—"
            loops = f" ({', '.join(e['loops'])} loop)" if e.get("loops") else ""
            lines.append(f"| {name}{loops} | {scope} | {e['tokens_per_s']:.1f} | {e['speedup_median']:.2f}× "
                         f"({e['speedup_p25']:.2f}–{e['speedup_p75']:.2f}) | {e['speedup_p10']:.2f}× | "
                         f"{e['speedup_worst']:.2f}× | {e['speedup_pooled']:.2f}× | {tau} | {ident} |")
    return "\n".join(lines)


def identity_failures(e: dict) -> list[int]:
    """Prompts whose greedy output differs from plain's other than by near-ties the referee confirmed."""
    return [p for p in e.get("mismatches", []) if p not in e.get("near_ties", [])]


def identity_cell(e: dict) -> str:
    """The table's "identical" cell: yes, "n near-ties" (bf16/fp16, all confirmed), or **NO: failures**."""
    bad, ties = identity_failures(e), len(e.get("near_ties", []))
    tie_text = f"{ties} near-tie{'s' * (ties != 1)}"
    if bad:
        return f"**NO: {len(bad)}**" + (f" (+ {tie_text})" if ties else "")
    return tie_text if ties else "yes"


def plot(res: dict, path: Path) -> None:
    """τ-per-position (conditional acceptance) per method, and speedup per dataset."""
    # A bare Figure (no pyplot): works headless and leaves the caller's backend alone (a notebook's inline one).
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4))
    a, b = fig.subplots(1, 2)
    for name, entry in res["methods"].items():
        if "conditional_acceptance" in entry["all"]:
            ca = entry["all"]["conditional_acceptance"]
            a.plot(range(1, len(ca) + 1), ca, marker="o", label=name)
    a.set(xlabel="draft position k", ylabel="P(accept k | 1..k-1 accepted)", title="conditional acceptance", ylim=(0, 1))
    a.legend(fontsize=8)
    names = list(res["methods"])
    scopes = [s for s in next(iter(res["methods"].values())) if s != "all"] or ["all"]
    width = 0.8 / len(scopes)
    for j, s in enumerate(scopes):
        b.bar([i + j * width for i in range(len(names))], [res["methods"][n][s]["speedup_pooled"] for n in names],
              width, label=s)
    b.axhline(1.0, color="k", lw=0.8)
    b.set_xticks([i + 0.4 - width / 2 for i in range(len(names))], names, rotation=20, fontsize=8)
    b.set(ylabel="speedup vs plain generate", title="speedup per dataset")
    b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def policy_name(policy, ngram: bool = False) -> str:
    """The method name of DSpark under a verify policy: dspark, dspark+auto (the default policy), dspark+scheduler,
    dspark-k3, dspark-threshold-0.5; with n-gram drafts (drafter.options.ngram_drafts) a "+ngram" suffix."""
    if policy == "all":
        name = "dspark"
    elif policy in ("scheduler", "auto"):
        name = f"dspark+{policy}"
    elif isinstance(policy, tuple):
        name = f"dspark-threshold-{policy[1]:g}"
    else:
        name = f"dspark-k{policy}"
    return name + ("+ngram" if ngram else "")


def dspark_methods(policies: str, drafter) -> list[Method]:
    """`--policies` text, e.g. "all,scheduler+ngram" → one Method per entry, all on the same drafter (run_bench
    sets its verify_policy and ngram_drafts per call)."""
    out = []
    for text in policies.split(","):
        o = DecodingOptions.parse(text.strip())
        out.append(Method(policy_name(o.verify_policy, o.ngram_drafts), drafter=drafter, policy=o.verify_policy,
                          ngram=o.ngram_drafts))
    return out


def on_loop(method: Method, loop: str) -> Method:
    """A DSpark method on another loop (DecodingOptions.loop: "static", "compiled"), named for it."""
    return dataclasses.replace(method, name=f"{method.name}@{loop}", loop=loop)
