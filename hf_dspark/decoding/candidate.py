"""DSparkCandidateGenerator: one DSpark round per call of transformers' assisted-decoding loop.

Ingest the target's tapped hidden states of the tokens it just accepted, draft (drafter.draft: parallel
backbone + sequential head + confidence), choose how many drafts to verify (policy.py), and return them
with the exact logits they were drawn from. How generate() reaches this class: routing.py.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
from transformers.generation import GenerationConfig
from transformers.generation.candidate_generator import CandidateGenerator

from .linears import round_linears
from .ngram import NgramIndex
from .options import DecodingOptions
from .processors import DSparkLogitsProcessor, guard
from .stats import DSparkStats, Round
from .policy import VerifyPolicy


class DSparkCandidateGenerator(CandidateGenerator):
    """One DSpark round per call: ingest the target's tapped hidden states of the tokens it just accepted,
    draft γ tokens (parallel backbone + sequential head + confidence), choose how many to verify, and return
    them with the exact logits they were drawn from. transformers then verifies (greedy prefix match or
    rejection sampling) and reports back through `update_candidate_strategy`.
    """

    requires_model_outputs = True

    def __init__(self, target, drafter, generation_config: GenerationConfig, logits_processor,
                 options: DecodingOptions | None = None):
        """options: this call's DecodingOptions (default: the drafter's `options`)."""
        self.target, self.drafter = target, drafter
        options = drafter.options if options is None else options
        cfg = drafter.config
        self.taps = list(cfg.target_layer_ids)
        # Only the tapped layers are materialised; if the user asked for all hidden states, keep them all.
        wanted = True if generation_config.output_hidden_states else [i + 1 for i in self.taps]
        self.model_kwargs_overrides = {"output_hidden_states": wanted}
        self.do_sample = bool(generation_config.do_sample)
        self.max_length = generation_config.max_length
        eos = generation_config.eos_token_id
        self.stop_ids = set() if eos is None else {int(e) for e in (eos if isinstance(eos, (list, tuple)) else
                                                                      torch.as_tensor(eos).view(-1).tolist())}
        # Drafts go through the target's pure processors, so q is what they are drawn from; stateful ones stay out
        # of drafting and are rolled back to the committed prefix after each verification (processors.py).
        self.draft_processor, self.rollbacks = guard(logits_processor)
        self.observer = DSparkLogitsProcessor()
        logits_processor.append(self.observer)
        self.block_size = cfg.block_size
        self.weights = drafter.draft_weights()  # pruned-vocabulary rows, gathered once
        self.context_kv: list | None = None  # per drafter layer (k, v) [1, n_kv, ctx_len, hd]: views of the buffer
        self._ctx_buffer: list | None = None  # per drafter layer (k, v) [1, n_kv, room, hd], preallocated
        self.ctx_len = 0
        # prompt positions the target holds but input_ids lacks (a prompt given as inputs_embeds), set at prefill
        self.offset = 0
        self.unfused: list[torch.Tensor] = []  # tapped features [1, rows, m·d] of positions not in context_kv yet
        self.pending: dict | None = None
        self.stats = DSparkStats(block_size=cfg.block_size, loop=options.loop)
        self.temperature = (generation_config.temperature if generation_config.temperature is not None else 1.0) \
            if self.do_sample else 0.0
        self.policy = VerifyPolicy.for_call(drafter, target, options, self.temperature)  # resolved once per call
        self.ngrams = NgramIndex() if options.ngram_drafts else None
        # the products the profile measured as faster for a round's few-row products (verification and drafting),
        # installed once the prefill (which keeps plain generate()'s products) is done and removed by `close` at the
        # end of the call (linears.py)
        self.linears = round_linears(getattr(self.policy.profile, "linear", "stock"), cfg.block_size, target, drafter,
                                     self.weights[1])
        drafter.last_stats = self.stats

    def close(self) -> None:
        """End of the call (routing.py): the target gets its own linear forwards back."""
        if self.linears is not None:
            self.linears.remove()

    @torch.no_grad()
    def get_candidates(self, input_ids, model_kwargs=None, model_outputs=None, is_first_iteration=False,
                       n_last_matches=0, **kwargs):
        """input_ids [1, cur_len] (prompt + committed tokens; the last one, the anchor, is not in the target's
        cache yet) → (candidate_ids [1, cur_len + ℓ], candidate_logits [1, ℓ, V] float32 or None)."""
        if is_first_iteration:  # the target must prefill first: we have no hidden states yet
            self.stats.prompt_tokens = input_ids.shape[1]
            if self.ngrams is not None:  # lookups match suffixes of the answer only (ngram.py)
                self.ngrams.answer_start = input_ids.shape[1]
            self.stats.started = time.perf_counter()
            return input_ids, None
        t0 = time.perf_counter()
        if self.linears is not None:
            self.linears.install()  # from the first verification on (idempotent)
        self._collect(input_ids, model_outputs)
        cur_len = input_ids.shape[1]
        room = self.max_length - cur_len - 1  # drafts that could still be committed
        lookup: list[int] = []
        if self.ngrams is not None:  # free n-gram drafts first: they depend on committed tokens only (ngram.py)
            self.ngrams.extend(input_ids[0, len(self.ngrams.seq):].tolist())
            lookup = self._through_stop(self.ngrams.draft(min(self.policy.max_ngram_drafts, room)))
            length = self.policy.ngram_length(len(lookup))  # under the scheduler: worth verifying, 0..n
            if length:  # q is a point mass: no logits, transformers verifies by sample-and-compare (or argmax)
                candidate = torch.cat([input_ids, input_ids.new_tensor([lookup[:length]])], dim=-1)
                return self._send(input_ids, candidate, None, lookup, [], "ngram", t0, lookup)
        n = min(self.block_size, room, self.policy.max_drafts)  # and that the policy could ever verify
        if n <= 0 or not self.policy.should_draft():  # a plain target step this round
            return self._send(input_ids, input_ids, None, [], [], "dspark", t0, lookup)
        self._fuse()
        # The backbone runs only the slots the policy can use (reach): more changed no acceptance we measured and
        # each costs time on CPU. The length limit only trims the block, so `replay` stays exact.
        block = self.drafter.draft(self.context_kv, input_ids, n, reach=self.policy.max_drafts,
                                   processor=self.draft_processor, do_sample=self.do_sample, weights=self.weights,
                                   offset=self.offset, temperature=self.temperature)
        conf = block.confidences  # calibrated c_k [n] on the CPU (one host sync for the policy and the stats)
        tokens = block.tokens.tolist()
        n = len(self._through_stop(tokens))  # drafts after a drafted stop token can never be committed
        length = self.policy.length(None if conf is None else conf[:n], n)  # ℓ in 0..n, from c_1..c_n only
        candidate = torch.cat([input_ids, block.tokens[:length].view(1, -1).to(input_ids.device)], dim=-1)
        # transformers verifies on input_ids' device (device_map targets: may differ from the drafter's)
        logits = block.logits[:length].unsqueeze(0).to(input_ids.device) if (self.do_sample and length) else None
        return self._send(input_ids, candidate, logits, tokens, [] if conf is None else conf.tolist(),
                          "dspark", t0, lookup)

    def _through_stop(self, drafts: list[int]) -> list[int]:
        """`drafts` up to and including the first stop token of the call. Lossless: whether x_k is offered depends
        on x_1..x_{k-1} only, and the scheduler's walk reaches the kept positions before any cut one."""
        for i, token in enumerate(drafts):
            if token in self.stop_ids:
                return drafts[: i + 1]
        return drafts

    def _send(self, input_ids, candidate, logits, drafts: list[int], conf: list[float], source: str, t0,
              lookup: Sequence[int] = ()):
        cur_len = input_ids.shape[1]
        self.observer.begin_round(candidate, cur_len)
        self.pending = {
            "cur_len": cur_len,
            "drafted": len(drafts),
            "tokens": drafts,
            "verified": candidate.shape[1] - cur_len,
            "confidence": conf,
            "source": source,
            "lookup": list(lookup),  # the n-gram drafts offered this round, verified or not (their survival is learnt)
            "draft_time": time.perf_counter() - t0,
            "sent": time.perf_counter(),
        }
        return candidate, logits

    def _collect(self, input_ids, model_outputs) -> None:
        """Keep the tapped hidden states of every position the target has newly verified and accepted: after
        prefill the whole prompt, later the anchor plus the accepted drafts (rows 0..m of the pass). They become
        context K/V (`_fuse`) only when a round drafts, in one batch: rounds without drafts cost nothing here."""
        if self.policy.max_drafts == 0:  # a policy that never drafts needs no context
            return
        hs = getattr(model_outputs, "hidden_states", None)
        if hs is None:
            raise RuntimeError("the target returned no hidden states; DSpark needs transformers' output_hidden_states")
        rows = hs[self.taps[0] + 1].shape[1]
        if self.ctx_len == 0 and not self.unfused:  # the prefill: with inputs_embeds its rows have no ids
            self.offset = max(0, rows - (input_ids.shape[1] - 1))
        new = input_ids.shape[1] - 1 + self.offset - self.ctx_len - sum(f.shape[1] for f in self.unfused)
        if new > rows:
            raise NotImplementedError(
                f"the target verified {rows} positions but {new} are new to the drafter: a pre-filled "
                "past_key_values (prompt caching) is not supported with DSpark"
            )
        dr = self.drafter
        if new > 0:  # taps may span devices; cat copies, so the pass's full hidden states are not kept alive
            self.unfused.append(torch.cat([hs[i + 1][:, :new].to(dr.device) for i in self.taps], dim=-1))

    def _fuse(self) -> None:
        """Append the context K/V of the collected positions: [(k, v) [1, n_kv, ctx_len, hd]] per drafter layer."""
        if not self.unfused:
            return
        dr = self.drafter
        feats = torch.cat(self.unfused, dim=1) if len(self.unfused) > 1 else self.unfused[0]
        self.unfused = []
        new = feats.shape[1]
        positions = torch.arange(self.ctx_len, self.ctx_len + new, device=dr.device)[None]
        kv = dr.context_kv(feats, positions)
        end = self.ctx_len + new
        if self._ctx_buffer is None or end > self._ctx_buffer[0][0].shape[2]:
            # preallocated once per call for every position the call can reach (grown only if a prompt given as
            # embeddings needs more), so a round writes its rows in place instead of copying the whole context
            room = max(end, self.max_length + self.offset)
            old = self._ctx_buffer
            self._ctx_buffer = [(k.new_empty(*k.shape[:2], room, k.shape[3]), v.new_empty(*v.shape[:2], room, v.shape[3]))
                                for k, v in kv]
            if old is not None:
                for (k1, v1), (k0, v0) in zip(self._ctx_buffer, old):
                    k1[:, :, : self.ctx_len], v1[:, :, : self.ctx_len] = k0[:, :, : self.ctx_len], v0[:, :, : self.ctx_len]
        for (kb, vb), (k, v) in zip(self._ctx_buffer, kv):
            kb[:, :, self.ctx_len : end], vb[:, :, self.ctx_len : end] = k, v
        self.context_kv = [(kb[:, :, :end], vb[:, :, :end]) for kb, vb in self._ctx_buffer]
        self.ctx_len = end

    def update_candidate_strategy(self, input_ids, scores, num_matches):
        """input_ids [1, new_len] after verification; scores [1, ℓ+1, V] processed target logits."""
        for rollback in self.rollbacks:
            rollback.restore(input_ids.shape[1])
        p, self.pending = self.pending, None
        if p is None:  # the prefill step
            return
        new_tokens = input_ids[0, p["cur_len"]:].tolist()
        accepted = 0  # drafts kept = common prefix of drafts and committed tokens (a stop may drop the bonus)
        while accepted < min(p["verified"], len(new_tokens)) and new_tokens[accepted] == p["tokens"][accepted]:
            accepted += 1
        if p["source"] == "dspark":  # the draft gate judges the drafter; n-gram rounds neither pay nor age it
            self.policy.record(p["drafted"], p["verified"], accepted)
        self.policy.observe_ngram(p["lookup"], new_tokens)
        probs = self.observer.target_probs
        self.stats.new_tokens = input_ids.shape[1] - self.stats.prompt_tokens
        self.stats.add(Round(
            drafted=p["drafted"], verified=p["verified"], accepted=accepted, committed=len(new_tokens),
            draft_time=p["draft_time"], verify_time=time.perf_counter() - p["sent"],
            confidence=p["confidence"], target_probs=[probs[k] for k in sorted(probs)],
            tokens=p["tokens"], new_tokens=new_tokens, source=p["source"],
        ))
