"""`hf-dspark data`: eval-prompt refusal, GSM8K suffix, the job plan, shards that round-trip and resume."""

import json

import pytest
import torch

from tests._tiny import tiny_target

from hf_dspark.training.data import (GSM8K_SUFFIX, ShardWriter, answer_prompts, check_excluded, done_ids, is_holdout,
                                     parse_source, plan, prompt_of, read_answers)


def _jsonl(path, prompts):
    path.write_text("".join(json.dumps({"turns": [p]}) + "\n" for p in prompts))
    return path


def test_gsm8k_files_get_the_eval_suffix(tmp_path):
    g = answer_prompts(_jsonl(tmp_path / "gsm8k_train.jsonl", ["What is 2+2?"]))
    a = answer_prompts(_jsonl(tmp_path / "alpaca.jsonl", ["Say hi."]))
    assert g == [{"id": "gsm8k_train:0", "prompt": "What is 2+2?" + GSM8K_SUFFIX}]
    assert a[0]["prompt"] == "Say hi."


def test_refuses_prompts_found_in_an_eval_file(tmp_path):
    train = answer_prompts(_jsonl(tmp_path / "gsm8k_train.jsonl", ["What is 2+2?", "What is 3+3?"]))
    ev = _jsonl(tmp_path / "gsm8k.jsonl", ["What is  3+3?" + GSM8K_SUFFIX])  # whitespace/suffix-insensitive
    with pytest.raises(ValueError, match="evaluation"):
        check_excluded(train, [ev])
    check_excluded(train[:1], [ev])  # no overlap: fine


def test_done_ids_skips_a_torn_last_line(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_text(json.dumps({"id": "a:0"}) + "\n" + '{"id": "a:1", "resp')
    assert done_ids(out) == {"a:0"}
    assert done_ids(tmp_path / "missing.jsonl") == set()


def test_shards_round_trip_and_resume(tmp_path):
    recs = [{"id": f"s:{i}#0", "prompt_ids": [1, 2, i], "response_ids": list(range(i + 1))} for i in range(7)]
    w = ShardWriter(tmp_path / "ans", shard_size=3)
    for r in recs[:5]:
        w.write(r)
    w.close()  # stopped mid-shard: part-00000.jsonl.gz sealed, part-00001.jsonl open with 2 answers
    assert sorted(p.name for p in (tmp_path / "ans").iterdir()) == ["part-00000.jsonl.gz", "part-00001.jsonl"]
    w = ShardWriter(tmp_path / "ans", shard_size=3)  # resume appends to the open shard
    for r in recs[5:]:
        w.write(r)
    w.close()
    assert list(read_answers(tmp_path / "ans")) == recs  # write → read: identical ids, in order
    assert sorted(p.name for p in (tmp_path / "ans").iterdir())[:2] == ["part-00000.jsonl.gz", "part-00001.jsonl.gz"]


def test_resume_after_a_write_cut_mid_line_loses_only_that_answer(tmp_path):
    recs = [{"id": f"s:{i}#0", "prompt_ids": [1], "response_ids": [i]} for i in range(3)]
    w = ShardWriter(tmp_path / "ans", shard_size=10)
    w.write(recs[0])
    w.close()
    with open(tmp_path / "ans" / "part-00000.jsonl", "a") as f:
        f.write('{"id": "s:9#0", "prompt_ids": [1], "resp')  # the job was killed mid-write
    w = ShardWriter(tmp_path / "ans", shard_size=10)
    for r in recs[1:]:
        w.write(r)
    w.close()
    assert list(read_answers(tmp_path / "ans")) == recs  # the next answer is not glued to the cut line


def test_plan_copies_holdout_and_shuffle(tmp_path):
    src = _jsonl(tmp_path / "mbpp_train.jsonl", [f"Write f{i}." for i in range(60)])
    jobs = plan([f"{src}:3"], seed=1, temperature=0.7)
    kept = [p for p in answer_prompts(src) if not is_holdout(p["id"])]
    assert 0 < len(kept) < 60  # some prompts are held out for calibration
    assert len(jobs) == 3 * len(kept)
    assert {k for k, _, _ in jobs} == {f"{p['id']}#{i}" for p in kept for i in range(3)}
    assert all((t == 0.0) == k.endswith("#0") for k, _, t in jobs)  # answer 0 greedy, the rest sampled
    assert jobs == plan([f"{src}:3"], seed=1, temperature=0.7) and jobs != plan([f"{src}:3"], seed=2)
    assert prompt_of("mbpp_train:4#2") == "mbpp_train:4"
    assert parse_source("a/b.jsonl") == ("a/b.jsonl", 1) and parse_source("b.jsonl:10") == ("b.jsonl", 10)
    with pytest.raises(ValueError, match="per prompt"):
        parse_source("b.jsonl:0")
