"""Replay τ: a drafter's acceptance measured on the target's own outputs, without running speculative decoding.

Running `generate` with a drafter costs a target forward per round; measuring τ on hundreds of prompts that
way takes hours on a CPU. Because decoding is lossless, the same numbers can be had from the target's plain
outputs: one target forward per sequence gives every tapped feature, and one teacher-forced drafter pass
drafts the block of *every* anchor at once (the training objective's block mask). The rounds are then walked
left to right exactly as `DSparkCandidateGenerator` + transformers would (verify all drafts, bonus token,
the length limit trimming the last blocks):

- greedy (responses at temperature 0: answer #0 of each prompt of `hf-dspark data`): draft k is accepted iff the drafter's argmax equals
  the target's next token. The drafter sees exactly what it sees in `generate` (context < anchor, Markov
  previous token = the accepted one), so the rounds are the same, up to float rounding of a batched forward.
- temperature 1 (responses sampled at T = 1, no top-k/top-p: answers #1.. of `hf-dspark data --temperature 1
  --top-p 1`; `responses_for` picks each mode's from one answer set): speculative sampling emits y ~ p, and given that
  the emitted token is y, the draft was accepted with probability min(p(y), q(y)) / p(y) (P(accept, y) =
  min(p, q)(y); P(y) = p(y)); what follows y does not depend on how y was produced. So walking the target's
  sample and drawing each acceptance with that probability reproduces the joint law of (output, rounds) of
  real speculative sampling. q is the drafter's distribution given the accepted previous token, as at
  inference (pruned draft vocabulary: q = 0 outside it).

tests/test_replay.py checks both against real `generate` runs.
"""

from __future__ import annotations

import torch
from tqdm.auto import tqdm

from ..decoding.stats import DSparkStats, Round
from ..training.anchors import block_mask
from ..training.features import target_features

MODE_TEMPERATURE = {"greedy": 0.0, "t1": 1.0}  # the sampling temperature each replay mode stands for


@torch.no_grad()
def slot_scores(drafter, prompt_ids: list[int], response_ids: list[int], chunk: int = 64,
                slots: int | None = None) -> dict:
    """One sequence x = prompt + response (length L, prompt P) → for every anchor a = P..L-2 and slot j:

    (`slots`: the backbone runs that many block slots, as `draft()` does for a round capped at slots − 1 drafts;
    default γ, DeepSpec's full block; the [A, γ] arrays below are then [A, slots].)

    match [A, γ] bool: the drafter's greedy draft j equals x_{a+j+1};
    accept [A, γ] float: min(1, q(x_{a+j+1}) / p(x_{a+j+1})) at temperature 1 (0 past the end);
    target_greedy [R] bool: x_{t+1} is the target's argmax after x_{≤t} (checks a greedy file is greedy);
    conf / conf_greedy [A, γ] float: raw confidence logits, teacher-forced / along the greedy draft's own chain
    (drafters with a confidence head).
    """
    dr, target = drafter, drafter.target
    g, dev = slots or dr.config.block_size, dr.device
    if not 1 <= g <= dr.config.block_size:
        raise ValueError(f"slots must be in [1, {dr.config.block_size}], got {slots}")
    ids = torch.tensor([list(prompt_ids) + list(response_ids)], device=target.device)
    P, L = len(prompt_ids), ids.shape[1]
    feats, last = target_features(target, ids, torch.ones_like(ids), dr.config.target_layer_ids)
    feats, last, ids = feats.to(dev), last.to(dev), ids.to(dev)
    kv = dr.context_kv(feats, torch.arange(L, device=dev)[None])
    logp_t = torch.log_softmax(dr.base_logits(last[0, P - 1 : L - 1]), -1)  # [R, V]: p after x_{≤t}
    nxt = ids[0, P:L]
    lp_target = logp_t.gather(-1, nxt[:, None])[:, 0]  # [R] log p(x_{t+1})
    target_greedy = logp_t.argmax(-1) == nxt
    vocab, lm_head, w2 = dr.draft_weights()
    pad = torch.cat([ids[0], ids.new_full((g + 1,), -1)])  # labels past the end never match
    if vocab is not None:  # full-vocabulary id → its column in the draft vocabulary (-1: not in it)
        where = torch.full((dr.config.vocab_size,), -1, dtype=torch.long, device=dev)
        where[vocab] = torch.arange(len(vocab), device=dev)
    matches, accepts, confs, confs_own = [], [], [], []
    for start in range(P, L - 1, chunk):
        a = torch.arange(start, min(start + chunk, L - 1), device=dev)  # [C] anchors
        C = a.shape[0]
        pos = a[:, None] + torch.arange(g, device=dev)  # [C, γ]: slot j sits at a+j, predicts x_{a+j+1}
        block_in = torch.full((C, g), dr.config.mask_token_id, device=dev)
        block_in[:, 0] = ids[0, a]
        h = dr.backbone(dr.embed(block_in.view(1, -1)), pos.view(1, -1), kv, block_mask(a[None], g, L))
        h = h.view(C, g, -1)
        labels, prev = pad[pos + 1], pad[pos].clamp(min=0)  # teacher forcing: prev = the accepted token
        base = dr.base_logits(h, lm_head)  # [C, γ, V'] float32
        z, own, conf_tf, conf_own = _chains(dr, base, h, prev, vocab, w2)
        draft_top = vocab[own] if vocab is not None else own
        matches.append(draft_top == labels)  # leading matches = the greedy rounds' accepted drafts
        if conf_tf is not None:
            confs.append(conf_tf)
            confs_own.append(conf_own)
        logq = torch.log_softmax(z, -1)
        if vocab is not None:  # q = 0 outside the draft vocabulary
            col = where[labels.clamp(min=0)]
            lq = logq.gather(-1, col.clamp(min=0)[..., None])[..., 0].masked_fill(col < 0, float("-inf"))
        else:
            lq = logq.gather(-1, labels.clamp(min=0)[..., None])[..., 0]
        t = (pos + 1 - P).clamp(max=L - P - 1)  # index of the label's step in lp_target
        acc = torch.exp(torch.clamp(lq - lp_target[t], max=0.0))
        accepts.append(acc.masked_fill(labels < 0, 0.0))
    out = {"match": torch.cat(matches).cpu(), "accept": torch.cat(accepts).float().cpu(),
           "target_greedy": target_greedy.cpu()}
    if confs:
        out["conf"], out["conf_greedy"] = torch.cat(confs).cpu(), torch.cat(confs_own).cpu()
    return out


def _chains(dr, base, h, prev, vocab, w2):
    """Two left-to-right passes of the sequential head over blocks [C, γ]: teacher-forced (previous token = the
    accepted one: q and c of a draft whose prefix survived) → logits z [C, γ, V'] and c; and the greedy draft's
    own chain (previous token = its own last draft, as `generate` drafts) → draft ids (in V') and its c."""
    W2 = (dr.markov_head.W2.weight if w2 is None else w2) if dr.markov_head is not None else None
    z, own, c_tf, c_own = [], [], [], []
    st_tf = st_own = None
    p_own = prev[:, 0]
    for k in range(base.shape[1]):
        e_tf = e_own = None
        z_tf = z_own = base[:, k]
        if dr.markov_head is not None:
            u, e_tf, st_tf = dr.markov_head.pre_bias(prev[:, k], h[:, k], st_tf)
            z_tf = z_tf + (u @ W2.T).float()
            u, e_own, st_own = dr.markov_head.pre_bias(p_own, h[:, k], st_own)
            z_own = z_own + (u @ W2.T).float()
        top = z_own.argmax(-1)
        if dr.confidence_head is not None:
            c_tf.append(dr.confidence_head(h[:, k], e_tf).float())
            c_own.append(dr.confidence_head(h[:, k], e_own).float())
        z.append(z_tf)
        own.append(top)
        p_own = vocab[top] if vocab is not None else top
    conf = (torch.stack(c_tf, 1), torch.stack(c_own, 1)) if c_tf else (None, None)
    return torch.stack(z, 1), torch.stack(own, 1), *conf


def walk(accepted_at, P: int, L: int, max_new_tokens: int, block_size: int, confidence=None) -> list[Round]:
    """The rounds of one generation of L - P tokens (prefill round excluded, as in DSparkStats), verify-all.

    accepted_at(a, j) → bool: is draft j of the block anchored at position a accepted (given 0..j-1 were)?
    Mirrors DSparkCandidateGenerator: n = min(γ, max_length - cur_len - 1) drafts; the target commits the
    accepted drafts plus one token, and the generation ends at L (EOS or the length limit)."""
    rounds, cur = [], P + 1  # the prefill committed the first new token
    max_length = P + max_new_tokens
    while cur < L:
        n = max(min(block_size, max_length - cur - 1), 0)
        accepted = 0
        while accepted < n and cur + accepted < L and accepted_at(cur - 1, accepted):
            accepted += 1
        committed = min(accepted + 1, L - cur)
        rounds.append(Round(drafted=n, verified=n, accepted=accepted, committed=committed, draft_time=0.0,
                            verify_time=0.0, confidence=confidence(cur - 1, n) if confidence and n else []))
        cur += committed
    return rounds


def responses_for(records, mode: str) -> list[dict]:
    """The records of an answer set (`hf-dspark data`'s, which hold a "temperature" and "top_p") that mode
    "greedy" or "t1" can replay: temperature 0, or temperature 1 without top-p. Records without a temperature
    (older files) are taken as they are. Raises if none is left, naming what the set holds."""
    if mode not in MODE_TEMPERATURE:
        raise ValueError(f"mode must be 'greedy' or 't1', got {mode!r}")
    records = list(records)

    def fits(r):
        if "temperature" not in r:
            return True
        t, top_p = float(r["temperature"]), r.get("top_p")
        return t == 0 if mode == "greedy" else t == 1 and (top_p is None or float(top_p) == 1)

    kept = [r for r in records if fits(r)]
    if not kept:
        held = sorted({(r.get("temperature"), r.get("top_p")) for r in records}, key=str)
        raise ValueError(f"none of the {len(records)} answers can be replayed in mode {mode!r} (it needs "
                         f"{'temperature 0' if mode == 'greedy' else 'temperature 1, top_p 1'}); "
                         f"(temperature, top_p) held: {held}")
    return kept


def replay(drafter, records: list[dict], mode: str, max_new_tokens: int, samples: int = 4, seed: int = 0,
           progress: bool = True) -> DSparkStats:
    """Pooled replay statistics over `records` ({"prompt_ids", "response_ids"}, as `hf-dspark data` writes).

    mode "greedy" or "t1"; at T = 1 every sequence is walked `samples` times with independent acceptance
    draws. Raises if a "greedy" file is not the target's greedy output (< 99% argmax agreement)."""
    if mode not in MODE_TEMPERATURE:
        raise ValueError(f"mode must be 'greedy' or 't1', got {mode!r}")
    if drafter.target is None:
        raise ValueError("bind the drafter to its target first (DSparkDrafter.from_pretrained(..., target=model))")
    stats = DSparkStats(block_size=drafter.config.block_size)
    gen = torch.Generator().manual_seed(seed)
    agree = total = 0
    for rec in tqdm(records, desc=f"replay ({mode})", disable=not progress):
        P, R = len(rec["prompt_ids"]), len(rec["response_ids"])
        if R < 2:
            continue
        if R > max_new_tokens:
            raise ValueError(f"record {rec.get('id')} has {R} response tokens > max_new_tokens={max_new_tokens}")
        s = slot_scores(drafter, rec["prompt_ids"], rec["response_ids"])
        agree, total = agree + int(s["target_greedy"].sum()), total + len(s["target_greedy"])
        conf = None
        if "conf" in s:  # greedy: the draft's own chain (exact); T = 1: teacher-forced (exact up to the first
            # rejection; later positions condition on the accepted token instead of the rejected draft)
            c = drafter.confidence_probs(s["conf_greedy" if mode == "greedy" else "conf"], MODE_TEMPERATURE[mode])
            conf = lambda a, n, c=c, P=P: c[a - P, :n].tolist()  # noqa: E731
        if mode == "greedy":
            m = s["match"]
            stats.rounds += walk(lambda a, j: bool(m[a - P, j]), P, P + R, max_new_tokens, stats.block_size, conf)
        else:
            for _ in range(samples):
                u = torch.rand(s["accept"].shape, generator=gen)
                ok = u < s["accept"]
                stats.rounds += walk(lambda a, j: bool(ok[a - P, j]), P, P + R, max_new_tokens, stats.block_size,
                                     conf)
        stats.new_tokens += R
    if mode == "greedy" and total and agree / total < 0.99:
        raise ValueError(f"only {agree / total:.1%} of the response tokens are the target's argmax: these are not "
                         "this target's greedy outputs (use mode 't1' for samples, or regenerate with --temperature 0)")
    stats.target_argmax_agreement = agree / total if total else float("nan")
    return stats
