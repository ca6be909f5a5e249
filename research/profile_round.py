"""Where a DSpark round's time goes on this machine (SmolLM2 + a drafter), phase by phase, medians.

    .venv/bin/python research/profile_round.py [--drafter PATH] [--dtype float32] [--threads 2] [--drafts 2]
        [--policy scheduler]

Phases: target decode step (k=1) and verification (k=γ+1) at a 300-token cache; drafter context ingest
(accepted rows), backbone, LM-head rows (full vs pruned vocabulary), sequential head loop, transformers'
own loop overhead (a whole generate round minus the parts).
"""

import argparse
import statistics
import time

import torch


def median_ms(fn, reps=15, warm=3):
    for _ in range(warm):
        fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return 1000 * statistics.median(ts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--drafter")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--drafts", type=int, nargs="*", default=[2], help="also time rounds of this many drafts "
                    "(what a policy caps the block to: the scheduler's max_verified, a static length)")
    ap.add_argument("--policy", default="scheduler", help="verify policy of the generate rounds at the end")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from hf_dspark import DSparkDrafter, load_default_target
    from hf_dspark.model.heads import draft_block

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[a.dtype]
    model, tok = load_default_target(dtype=dtype)
    drafter = (DSparkDrafter.from_pretrained(a.drafter, target=model) if a.drafter
               else DSparkDrafter.from_target(model, mask_token_id=16))
    g = drafter.config.block_size
    ids = torch.randint(100, 40000, (1, 300))
    rows = {}
    with torch.no_grad():
        out = model(ids, use_cache=True)
        cache = out.past_key_values
        for k in (1, g + 1):
            def step(k=k):
                model(ids[:, :k], past_key_values=cache, use_cache=True, output_hidden_states=[i + 1 for i in drafter.config.target_layer_ids])
                cache.crop(-k)
            rows[f"target forward, {k} token(s)"] = median_ms(step)
        hs = model(ids, output_hidden_states=True).hidden_states
        feats = torch.cat([hs[i + 1] for i in drafter.config.target_layer_ids], -1)
        kv = drafter.context_kv(feats[:, :296], torch.arange(296)[None])
        rows["drafter: ingest 4 accepted rows"] = median_ms(lambda: drafter.context_kv(feats[:, 296:300], torch.arange(296, 300)[None]))
        vocab, lm_rows, w2 = drafter.draft_weights()
        prefix = ids[:, :300]
        for n in sorted({g, *a.drafts}, reverse=True):  # a whole block, and the sizes policies cap it to
            slots = drafter.backbone_slots(n)
            emb = drafter.embed(torch.full((1, slots), 16))
            pos = torch.arange(300, 300 + slots)[None]
            rows[f"drafter: backbone, {slots} slots"] = median_ms(lambda: drafter.backbone(emb, pos, kv))
            h = drafter.backbone(emb, pos, kv)[0, :n]
            rows[f"drafter: LM head, {lm_rows.weight.shape[0]} rows x {n}"] = median_ms(lambda: drafter.base_logits(h, lm_rows))
            if vocab is not None and n == g:
                rows[f"drafter: LM head, full {model.config.vocab_size} rows x {g}"] = median_ms(lambda: drafter.base_logits(h))
            U = drafter.base_logits(h, lm_rows)
            rows[f"drafter: sequential head + confidence (greedy), {n} drafts"] = median_ms(lambda: draft_block(
                U, h, torch.tensor(5), drafter.markov_head, drafter.confidence_head, prefix, None, False, vocab=vocab, w2=w2,
                vocab_size=model.config.vocab_size))
            rows[f"drafter: whole round (drafter.draft, greedy), {n} drafts"] = median_ms(
                lambda: drafter.draft(kv, prefix, n, weights=(vocab, lm_rows, w2)))
    prompt = tok.apply_chat_template([{"role": "user", "content": "Explain photosynthesis in two sentences."}],
                                     add_generation_prompt=True, return_tensors="pt", return_dict=True)
    drafter.options.verify_policy = int(a.policy) if a.policy.isdigit() else a.policy
    model.generate(**prompt, max_new_tokens=16, assistant_model=drafter)
    t0 = time.perf_counter()
    model.generate(**prompt, max_new_tokens=64, min_new_tokens=64, assistant_model=drafter)
    total = time.perf_counter() - t0
    st = drafter.last_stats
    rows["generate: wall per round"] = 1000 * total / max(len(st.rounds), 1)
    rows["generate: drafter per drafted round (measured in get_candidates)"] = 1000 * st.draft_time / max(st.drafted_rounds, 1)
    rows["generate: verify per round (target + selection + bookkeeping)"] = 1000 * st.verify_time / max(len(st.rounds), 1)
    print(f"threads={a.threads} dtype={a.dtype} block={g} policy={a.policy} τ={st.tau:.2f} "
          f"({st.drafted_rounds}/{len(st.rounds)} rounds drafted)")
    for k, v in rows.items():
        print(f"{k:64s} {v:8.1f} ms")


if __name__ == "__main__":
    main()
