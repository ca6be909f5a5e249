"""The demo's pure logic: what happened to each drafted token, and that story as HTML (no gradio here).

Fates of one round (stats.Round): drafts x_1..x_n, ℓ of them verified, a accepted (a prefix), then the
target's own token at position a+1 (a correction if a draft was rejected there, else a bonus):

    accepted   x_1..x_a                   drafts the target kept
    rejected   x_{a+1}..x_ℓ               verified but not kept (x_{a+1} is the one the target replaced)
    trimmed    x_{ℓ+1}..x_min(n, block)   drafted, but the verify policy (scheduler) did not send them
    target     new_tokens[a:]             bonus / correction token from the target's own distribution

Discarded drafts (rejected, trimmed) are shown struck through right before the target token that took
their place. Drafts copied from the context (drafter.options.ngram_drafts) are underlined with dots. Drafts past the user's block-size cap are not shown: they were never candidates.
Every piece of text that reaches HTML goes through `esc`, model output included.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..decoding.stats import DSparkStats, Round

FATES = ("accepted", "rejected", "trimmed", "target")
LEGEND = {
    "accepted": "accepted draft",
    "rejected": "rejected draft",
    "trimmed": "trimmed by the scheduler (never verified)",
    "target": "bonus / correction token from the target",
}
NGRAM_LEGEND = "n-gram draft (copied from the context)"


def esc(text) -> str:
    """HTML-escape anything shown to the user (quotes too: text also lands in attributes)."""
    return html.escape(str(text), quote=True)


@dataclass
class TokenFate:
    token_id: int
    fate: str  # one of FATES
    round: int  # 1-based round; 0 = the token the target produced at prefill
    position: int  # 1-based slot in the round's block (the target token sits at a+1)
    confidence: float | None = None  # predicted survival c_k of a draft
    target_prob: float | None = None  # target probability of a verified draft
    detail: str = ""  # "bonus", "correction", "prefill" for target tokens
    source: str = "dspark"  # who drafted it: "dspark" (the drafter) or "ngram" (copied from the context)

    @property
    def committed(self) -> bool:
        return self.fate in ("accepted", "target")


def _at(xs: Sequence[float], i: int) -> float | None:
    return float(xs[i]) if i < len(xs) else None


def classify_round(r: Round, index: int, block: int | None = None) -> list[TokenFate]:
    """The fates of round `index` (1-based), in display order: accepted, discarded drafts, target token(s)."""
    a, n = r.accepted, len(r.tokens)
    shown = n if block is None else min(n, max(block, r.verified))
    out = [TokenFate(t, "accepted", index, k + 1, _at(r.confidence, k), _at(r.target_probs, k), source=r.source)
           for k, t in enumerate(r.new_tokens[:a])]
    for k in range(a, shown):
        fate = "rejected" if k < r.verified else "trimmed"
        out.append(TokenFate(r.tokens[k], fate, index, k + 1, _at(r.confidence, k), _at(r.target_probs, k),
                             source=r.source))
    detail = "correction" if a < r.verified else "bonus"
    out += [TokenFate(t, "target", index, a + 1 + j, detail=detail) for j, t in enumerate(r.new_tokens[a:])]
    return out


def classify(prefill_ids: Sequence[int], rounds: Sequence[Round], block: int | None = None) -> list[TokenFate]:
    """All fates of a generation: the target's prefill token(s), then every round's."""
    out = [TokenFate(t, "target", 0, 1, detail="prefill") for t in prefill_ids]
    for i, r in enumerate(rounds, start=1):
        out += classify_round(r, i, block)
    return out


def committed_ids(fates: Sequence[TokenFate]) -> list[int]:
    return [f.token_id for f in fates if f.committed]


def hover_text(f: TokenFate) -> str:
    """The tooltip: where the token came from, predicted survival vs what happened."""
    if f.fate == "target":
        where = "prefill" if f.round == 0 else f"round {f.round}, position {f.position}"
        return f"{where}: {f.detail} token from the target"
    p = "" if f.target_prob is None else f", target p={f.target_prob:.2f}"
    outcome = {"accepted": "accepted", "rejected": "rejected", "trimmed": "trimmed (not verified)"}[f.fate]
    if f.source == "ngram":
        return f"round {f.round}, n-gram draft position {f.position} (copied from the context) → {outcome}{p}"
    c = "n/a" if f.confidence is None else f"{f.confidence:.2f}"
    return f"round {f.round}, draft position {f.position}: predicted survival c={c} → {outcome}{p}"


def _visible(text: str) -> str:
    # Whitespace-only drafts would be invisible once struck through; show them as symbols.
    return text.replace("\n", "↵\n") if text.strip() else (text.replace(" ", "·").replace("\n", "↵") or "∅")


def render_token(f: TokenFate, text: str) -> str:
    shown = _visible(text) if f.fate in ("rejected", "trimmed") else (text or "∅")
    body = esc(shown)
    if f.fate in ("rejected", "trimmed"):
        body = f"<s>{body}</s>"
    data = f' data-round="{f.round}" data-pos="{f.position}"'
    ngram = " tok-ngram" if f.source == "ngram" and f.fate != "target" else ""
    return f'<span class="tok tok-{f.fate}{ngram}" title="{esc(hover_text(f))}"{data}>{body}</span>'


def render_tokens(fates: Sequence[TokenFate], decode: Callable[[int], str]) -> str:
    return "".join(render_token(f, decode(f.token_id)) for f in fates)


def legend_html() -> str:
    chips = "".join(f'<span class="tok tok-{k}">{esc(v)}</span> ' for k, v in LEGEND.items())
    chips += f'<span class="tok tok-accepted tok-ngram">{esc(NGRAM_LEGEND)}</span>'
    return f'<div class="legend">{chips}</div>'


def answer_html(prompt: str, fates: Sequence[TokenFate], decode: Callable[[int], str], done: bool,
                note: str = "") -> str:
    """The answer panel: the (escaped) prompt, the coloured tokens, and a marker once the stream has ended."""
    status = '<div class="stream-done" data-done="1">done</div>' if done else '<div class="streaming">generating…</div>'
    note_html = f'<div class="note">{esc(note)}</div>' if note else ""
    return (f'<div class="dspark-answer">{legend_html()}<div class="prompt"><b>Prompt:</b> {esc(prompt)}</div>'
            f'<div class="tokens">{render_tokens(fates, decode)}</div>{note_html}{status}</div>')


def plain_html(text: str, done: bool) -> str:
    status = '<div class="stream-done" data-done="1">done</div>' if done else '<div class="streaming">generating…</div>'
    return (f'<div class="dspark-plain"><b>plain generate:</b><div class="tokens">{esc(text.strip())}</div>'
            f'{status}</div>')


# ---- the live panel ---------------------------------------------------------------------------------------
def predicted_survival(rounds: Sequence[Round], block_size: int) -> list[float]:
    """Mean predicted c_k over the rounds that reached position k (same conditioning as conditional_acceptance)."""
    out = []
    for k in range(1, block_size + 1):
        cs = [r.confidence[k - 1] for r in rounds
              if r.verified >= k and r.accepted >= k - 1 and len(r.confidence) >= k]
        out.append(sum(cs) / len(cs) if cs else float("nan"))
    return out


def _bars_svg(values: Sequence[float], labels: Sequence[str], title: str, vmax: float,
              dots: Sequence[float] | None = None, fmt: str = "{:.2f}") -> str:
    """A tiny SVG bar chart (numbers only in it; labels escaped). NaN bars are left out."""
    w, h, pad, top = 28, 90, 18, 30  # top leaves room for the title above the tallest bar's value
    width = max(pad + w * len(values) + 6, 7 * len(title))  # room for the title
    parts = [f'<svg class="bars" width="{width}" height="{top + h + pad}" role="img" aria-label="{esc(title)}">',
             f'<text x="2" y="11" class="svg-title">{esc(title)}</text>']
    for i, v in enumerate(values):
        x = pad + i * w
        if not math.isnan(v):
            bh = 0 if vmax <= 0 else h * min(v / vmax, 1.0)
            parts.append(f'<rect x="{x + 3}" y="{top + h - bh:.1f}" width="{w - 6}" height="{bh:.1f}" class="bar">'
                         f'<title>{esc(labels[i])}: {esc(fmt.format(v))}</title></rect>')
            parts.append(f'<text x="{x + w / 2:.1f}" y="{top + h - bh - 2:.1f}" class="val">{esc(fmt.format(v))}</text>')
        if dots is not None and i < len(dots) and not math.isnan(dots[i]):
            cy = top + h - h * min(dots[i] / vmax, 1.0)
            parts.append(f'<circle cx="{x + w / 2:.1f}" cy="{cy:.1f}" r="3.5" class="dot">'
                         f'<title>mean predicted c: {dots[i]:.2f}</title></circle>')
        parts.append(f'<text x="{x + w / 2:.1f}" y="{top + h + 13}" class="lab">{esc(labels[i])}</text>')
    parts.append("</svg>")
    return "".join(parts)


def acceptance_svg(stats: DSparkStats) -> str:
    k = stats.block_size
    return _bars_svg(stats.conditional_acceptance, [str(i) for i in range(1, k + 1)],
                     "acceptance by position (bars) vs predicted c (dots)", 1.0,
                     dots=predicted_survival(stats.rounds, k))


def verify_lengths_svg(stats: DSparkStats, block: int) -> str:
    counts = stats.verify_lengths
    values = [float(counts.get(i, 0)) for i in range(block + 1)]
    return _bars_svg(values, [str(i) for i in range(block + 1)], "verify lengths ℓ (rounds)",
                     max(values + [1.0]), fmt="{:.0f}")


def stats_html(stats: DSparkStats | None, n_tokens: int, elapsed: float, block: int, policy: str) -> str:
    if stats is None or not stats.rounds:
        return '<div class="dspark-stats"><i>waiting for the first round…</i></div>'
    rounds = stats.rounds
    mean_l = sum(r.verified for r in rounds) / len(rounds)
    tps = n_tokens / elapsed if elapsed > 0 else 0.0
    rows = [("τ (tokens per round, incl. bonus)", f"{stats.tau:.2f}"), ("tokens/s", f"{tps:.1f}"),
            ("rounds", str(len(rounds))), ("new tokens", str(n_tokens)),
            ("mean verified ℓ", f"{mean_l:.2f} of {block}"), ("verify policy", policy)]
    if stats.ngram_rounds:
        rows.insert(3, ("n-gram rounds (drafts copied from the context)", str(stats.ngram_rounds)))
    table = "".join(f'<tr><td>{esc(k)}</td><td class="num" data-key="{esc(k.split(" ")[0])}">{esc(v)}</td></tr>'
                    for k, v in rows)
    return (f'<div class="dspark-stats"><table>{table}</table>'
            f'<div class="plots">{acceptance_svg(stats)}{verify_lengths_svg(stats, block)}</div></div>')


def race_html(dspark_tps: float, plain_tps: float, identical: bool | None) -> str:
    speedup = dspark_tps / plain_tps if plain_tps > 0 else float("nan")
    if identical is None:
        same = "sampling: the two answers are independent draws, not expected to match"
    else:
        same = "greedy texts identical ✓" if identical else "greedy texts DIFFER ✗"
    return (f'<div class="dspark-race"><b>Race</b>: DSpark {dspark_tps:.1f} tok/s vs plain generate '
            f'{plain_tps:.1f} tok/s → <b>{speedup:.2f}×</b>. <span class="identical">{esc(same)}</span></div>')


CSS = """
.dspark-answer .tokens, .dspark-plain .tokens { white-space: pre-wrap; font-family: ui-monospace, monospace;
  line-height: 1.9; font-size: 15px; overflow-wrap: anywhere; word-break: break-all; }
.tok { border-radius: 3px; padding: 1px 0; }
.tok-accepted { background: #b7f0c0; color: #0b4d17; }
.tok-target { background: #bcd7ff; color: #0b2c66; }
.tok-rejected { background: #ffc9c9; color: #8a1010; font-size: 0.85em; }
.tok-trimmed { background: #eeeeee; color: #888888; font-size: 0.85em; font-style: italic; }
.tok-ngram { text-decoration: underline dotted; text-underline-offset: 3px; }
.legend .tok { margin-right: 8px; padding: 2px 6px; font-size: 13px; }
.prompt { margin: 6px 0; color: #555; }
.note { color: #a05a00; margin-top: 6px; }
.stream-done { color: #3a3; font-size: 12px; } .streaming { color: #999; font-size: 12px; }
.dspark-stats table td { padding: 1px 8px; } .dspark-stats .num { font-weight: bold; text-align: right; }
.bars .bar { fill: #4c8bf5; } .bars .dot { fill: #e8710a; } .bars text { font-size: 10px; fill: #444; }
.bars .val, .bars .lab { text-anchor: middle; } .bars .svg-title { font-size: 11px; } .plots { display: flex; gap: 16px; flex-wrap: wrap; }
.untrained { background: #fff3cd; border: 1px solid #e0b400; padding: 6px 10px; border-radius: 4px; }
.quiet-note { color: #777; font-size: 12px; }
body:has(#fold-drafts input:checked) .dspark-answer .tokens .tok-rejected,
body:has(#fold-drafts input:checked) .dspark-answer .tokens .tok-trimmed { display: none; }
"""
