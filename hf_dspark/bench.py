"""`hf-dspark bench`: DSpark against what a transformers user already has, measured side by side.

Methods run in one process on the same prompts, interleaved prompt by prompt (the order rotates), so machine
drift hits all alike: plain `generate`, prompt lookup, the DFlash ablation drafter, DSpark with a fixed block,
DSpark with the prefix scheduler. Greedy outputs are checked token for token against plain decoding; any
mismatch is a failure, reported loudly (exit code 1).
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from tqdm.auto import tqdm


@dataclass
class Method:
    """A way to generate: `extra` are generate() kwargs; `drafter` (optional) with its `policy`, and whether it
    takes n-gram drafts when it can (`ngram`: drafter.ngram_drafts)."""

    name: str
    extra: dict = field(default_factory=dict)
    drafter: object | None = None
    policy: object = "all"
    ngram: bool = False


def load_prompts(paths: list[str], limit: int | None) -> list[tuple[str, str]]:
    """(dataset name, first user turn) from `{"turns": [...]}` JSONL files, the first `limit` of each."""
    out = []
    for path in paths:
        rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
        out += [(Path(path).stem, r["turns"][0]) for r in rows[:limit]]
    return out


def _environment(model) -> dict:
    cpu = next((l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                if l.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else platform.processor()
    import transformers

    return {
        "cpu": cpu,
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "dtype": str(model.dtype).replace("torch.", ""),
        "device": str(model.device),
    }


def run_bench(model, tok, methods: list[Method], prompts: list[tuple[str, str]], max_new_tokens: int = 256,
              do_sample: bool = False, temperature: float = 1.0, seed: int = 980406, warmup: int = 1,
              check: Callable | None = None) -> dict:
    """Run every method on every prompt (rotating order); return every number as a JSON-able dict.

    `check(method, prompt_index, output_ids)` may replace an output before the identity check (tests use it to
    corrupt one and prove the check fires)."""
    base = methods[0].name
    gen = dict(max_new_tokens=max_new_tokens, do_sample=do_sample)
    if do_sample:
        gen["temperature"] = temperature
    encoded = []
    for _, text in prompts:
        msgs = [{"role": "user", "content": text}]
        ids = (tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
               if getattr(tok, "chat_template", None) else tok(text, return_tensors="pt")["input_ids"])
        encoded.append(ids.to(model.device))

    def one(m: Method, ids):
        kw = dict(gen, **m.extra)
        if m.drafter is not None:
            m.drafter.verify_policy, m.drafter.ngram_drafts = m.policy, m.ngram
            kw["assistant_model"] = m.drafter
        t0 = time.perf_counter()
        out = model.generate(ids, **kw)
        return out, time.perf_counter() - t0

    for ids in encoded[:warmup]:  # first-call costs (allocations, profile measurement) stay out of the numbers
        for m in methods:
            one(m, ids)

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
                "new_tokens": out.shape[1] - ids.shape[1],
                "rounds": [vars(r) for r in st.rounds] if st is not None else None,
            })
        if not do_sample:
            for name, out in outs.items():
                same = out.tolist() == outs[base].tolist()
                next(r for r in rows if r["prompt"] == i and r["method"] == name)["identical"] = same
    return summarize(rows, methods, base, prompts, model, gen)


def _pooled_stats(rows: list[dict], block: int) -> dict:
    from .stats import DSparkStats, Round

    st = DSparkStats(block_size=block)
    for r in rows:
        st.rounds += [Round(**x) for x in r["rounds"]]
    return {"tau": st.tau, "rounds": len(st.rounds), "drafted_rounds": st.drafted_rounds,
            "ngram_rounds": st.ngram_rounds, "conditional_acceptance": st.conditional_acceptance,
            "acceptance_rate": st.acceptance_rate, "verify_lengths": st.verify_lengths,
            "draft_time_s": st.draft_time, "verify_time_s": st.verify_time}


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
            q = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else [ratios[0]] * 3
            e = {
                "tokens_per_s": sum(r["new_tokens"] for r in sel) / sum(r["seconds"] for r in sel),
                "speedup_median": statistics.median(ratios), "speedup_p25": q[0], "speedup_p75": q[2],
                "speedup_pooled": (sum(r["new_tokens"] for r in sel) / sum(r["seconds"] for r in sel))
                / (sum(b["new_tokens"] for b in base_sel.values()) / sum(b["seconds"] for b in base_sel.values())),
            }
            if m.drafter is not None:
                e.update(_pooled_stats(sel, m.drafter.config.block_size))
            if "identical" in (sel[0] if sel else {}):
                e["mismatches"] = [r["prompt"] for r in sel if not r["identical"]]
            entry[scope] = e
        res["methods"][m.name] = entry
    return res


def markdown_table(res: dict) -> str:
    lines = ["| method | dataset | tok/s | speedup (median, p25–p75) | pooled speedup | τ | identical |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, entry in res["methods"].items():
        for scope, e in entry.items():
            if scope == "all" and len(entry) == 2:
                continue  # one dataset: its row says it all
            ident = "—" if "mismatches" not in e else ("yes" if not e["mismatches"] else f"**NO: {len(e['mismatches'])}**")
            tau = f"{e['tau']:.2f}" if "tau" in e else "—"
            lines.append(f"| {name} | {scope} | {e['tokens_per_s']:.1f} | {e['speedup_median']:.2f}× "
                         f"({e['speedup_p25']:.2f}–{e['speedup_p75']:.2f}) | {e['speedup_pooled']:.2f}× | {tau} | {ident} |")
    return "\n".join(lines)


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
    """The method name of DSpark under a verify policy: dspark, dspark+scheduler, dspark-k3, dspark-threshold-0.5;
    with n-gram drafts (drafter.ngram_drafts) a "+ngram" suffix."""
    if policy == "all":
        name = "dspark"
    elif policy == "scheduler":
        name = "dspark+scheduler"
    elif isinstance(policy, tuple):
        name = f"dspark-threshold-{policy[1]:g}"
    else:
        name = f"dspark-k{policy}"
    return name + ("+ngram" if ngram else "")


def dspark_methods(policies: str, drafter) -> list[Method]:
    """`--policies` text, e.g. "all,scheduler+ngram" → one Method per entry, all on the same drafter (run_bench
    sets its verify_policy and ngram_drafts per call)."""
    from .cli import _policy

    out = []
    for text in policies.split(","):
        text = text.strip()
        ngram = text.endswith("+ngram")
        policy = _policy(text.removesuffix("+ngram"))
        out.append(Method(policy_name(policy, ngram), drafter=drafter, policy=policy, ngram=ngram))
    return out


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="DSpark vs plain generate, prompt lookup and the DFlash ablation, side by side")
    p.add_argument("prompts", nargs="+", help="JSONL prompt files ({'turns': [...]})")
    p.add_argument("--limit", type=int, default=100, help="prompts per file")
    p.add_argument("--target", help="model id or folder (default: embedded SmolLM2)")
    p.add_argument("--drafter", help="DSpark drafter folder (default: the shipped drafter)")
    p.add_argument("--ablation", help="DFlash-ablation drafter folder (--head none); omitted if not given")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--do-sample", action="store_true")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--prompt-lookup", type=int, default=7, help="prompt_lookup_num_tokens (0 = skip)")
    p.add_argument("--policies", default="all,scheduler",
                   help="DSpark verify policies to run, comma separated: all, scheduler, an int k (static length), "
                        "threshold:T (static confidence threshold); a '+ngram' suffix (scheduler+ngram) adds "
                        "n-gram drafts (drafter.ngram_drafts)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--out", default="out/bench", help="folder for results.json, results.md, plot.png")
    p.set_defaults(func=cmd_bench)


def cmd_bench(args) -> int:
    from .cli import _dtype, load_target_and_drafter
    from .drafter import DSparkDrafter

    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok, drafter, _ = load_target_and_drafter(args.target, args.drafter, _dtype(args.dtype), "cpu"
                                                     if not torch.cuda.is_available() else "cuda")
    methods = [Method("plain")]
    if args.prompt_lookup:
        methods.append(Method(f"prompt-lookup-{args.prompt_lookup}", {"prompt_lookup_num_tokens": args.prompt_lookup}))
    if args.ablation:
        methods.append(Method("dflash-ablation", drafter=DSparkDrafter.from_pretrained(args.ablation, target=model)))
    methods += dspark_methods(args.policies, drafter)
    prompts = load_prompts(args.prompts, args.limit)
    res = run_bench(model, tok, methods, prompts, args.max_new_tokens, args.do_sample, args.temperature)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(res, indent=1, default=str))
    table = markdown_table(res)
    (out / "results.md").write_text(table + "\n")
    plot(res, out / "plot.png")
    print(table)
    bad = {n: e["all"]["mismatches"] for n, e in res["methods"].items() if e["all"].get("mismatches")}
    if bad:
        print(f"\n!!! GREEDY MISMATCH against plain generate: {bad} (prompt indices) !!!")
        return 1
    return 0
