"""`hf-dspark data`: eval-prompt refusal, GSM8K suffix, resumability bookkeeping, batched generation cut at EOS."""

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _tiny import tiny_target

from hf_dspark.training.data import GSM8K_SUFFIX, check_excluded, done_ids, generate_batch, read_prompts


def _jsonl(path, prompts):
    path.write_text("".join(json.dumps({"turns": [p]}) + "\n" for p in prompts))
    return path


def test_gsm8k_files_get_the_eval_suffix(tmp_path):
    g = read_prompts(_jsonl(tmp_path / "gsm8k_train.jsonl", ["What is 2+2?"]))
    a = read_prompts(_jsonl(tmp_path / "alpaca.jsonl", ["Say hi."]))
    assert g == [{"id": "gsm8k_train:0", "prompt": "What is 2+2?" + GSM8K_SUFFIX}]
    assert a[0]["prompt"] == "Say hi."


def test_refuses_prompts_found_in_an_eval_file(tmp_path):
    train = read_prompts(_jsonl(tmp_path / "gsm8k_train.jsonl", ["What is 2+2?", "What is 3+3?"]))
    ev = _jsonl(tmp_path / "gsm8k.jsonl", ["What is  3+3?" + GSM8K_SUFFIX])  # whitespace/suffix-insensitive
    with pytest.raises(ValueError, match="evaluation"):
        check_excluded(train, [ev])
    check_excluded(train[:1], [ev])  # no overlap: fine


def test_done_ids_skips_a_torn_last_line(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_text(json.dumps({"id": "a:0"}) + "\n" + '{"id": "a:1", "resp')
    assert done_ids(out) == {"a:0"}
    assert done_ids(tmp_path / "missing.jsonl") == set()


def test_generate_batch_left_pads_and_cuts_after_eos():
    t = tiny_target()

    class Tok:
        pad_token_id, eos_token_id = 0, 2

    prompts = [[5, 6, 7], [8, 9, 10, 11, 12]]
    outs = generate_batch(t, Tok(), prompts, max_new_tokens=6, temperature=0.0, top_p=1.0)
    for p, o in zip(prompts, outs):
        ref = t.generate(torch.tensor([p]), max_new_tokens=6, do_sample=False, pad_token_id=0)[0, len(p):].tolist()
        cut = next((i + 1 for i, x in enumerate(ref) if x == 2), len(ref))
        assert o == ref[:cut]
