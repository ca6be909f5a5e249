"""Prompts in, token ids out: the one reader of prompt files and the one chat encoder of the package."""

from __future__ import annotations

import json
from pathlib import Path

import torch


def read_prompts(path: str | Path) -> list[tuple[str, str]]:
    """A prompt file → [(id, prompt)], id = "<file stem>:<line index>" (0-based, blank lines counted).

    `.jsonl` files hold one JSON object a line, `{"turns": [prompt, ...]}` (the first turn is the prompt) or
    `{"prompt": ...}`; any other file is plain text, one prompt a line. A line that breaks this, an empty file or
    one that is not text is a ValueError naming the file and line.
    """
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not a UTF-8 text file ({e.reason} at byte {e.start})") from None
    jsonl = path.suffix == ".jsonl"
    out = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        out.append((f"{path.stem}:{i}", _prompt_of(line, f"{path}:{i + 1}") if jsonl else line.strip()))
    if not out:
        raise ValueError(f"{path} holds no prompts")
    return out


def _prompt_of(line: str, where: str) -> str:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not a JSON line ({e.msg}); a .jsonl prompt file holds one JSON object a line") \
            from None
    turns = row.get("turns") if isinstance(row, dict) else None
    if isinstance(turns, list) and turns and isinstance(turns[0], str):
        return turns[0]
    if isinstance(row, dict) and isinstance(row.get("prompt"), str):
        return row["prompt"]
    raise ValueError(f'{where}: expected {{"turns": [prompt, ...]}} or {{"prompt": ...}}, got {line[:80]!r}')


def chat_ids(tokenizer, prompt: str) -> list[int]:
    """`prompt` as one user turn under the tokenizer's chat template, ending with the assistant header (plain
    text with the tokenizer's special tokens when it has no template) → token ids."""
    if getattr(tokenizer, "chat_template", None):
        enc = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                            tokenize=True, return_dict=True)
        return list(enc["input_ids"])
    return list(tokenizer(prompt)["input_ids"])


def chat_inputs(tokenizer, prompt: str, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """`chat_ids` as generate() inputs: {"input_ids", "attention_mask"} [1, P] on `device`."""
    ids = torch.tensor([chat_ids(tokenizer, prompt)], device=device)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
