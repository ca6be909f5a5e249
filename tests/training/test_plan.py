"""training/plan.py: a stable validation split and epochs over a training stream that grows between runs."""

import pytest


def test_split_of_a_growing_stream_is_stable():
    from hf_dspark.training.plan import split

    recs = [{"id": f"src:{i // 2}#{i % 2}", "ids": [1, 2, 3], "n_prompt": 1} for i in range(20)]
    train_a, val_a = split(recs[:12], 3)
    train_b, val_b = split(recs, 3)
    assert val_a == val_b == recs[:3]
    held = {"src:0", "src:1"}
    assert all(r["id"].split("#")[0] not in held for r in train_b)  # no validation prompt is trained on
    assert train_b[: len(train_a)] == train_a  # the old training stream is a prefix of the new one


def test_split_holds_out_the_first_answers_of_each_source():
    from hf_dspark.training.plan import split

    recs = [{"id": f"{src}:{i}#0", "ids": [1, 2, 3], "n_prompt": 1} for i in range(6) for src in ("math", "chat")]
    recs += [{"id": "late:0#0", "ids": [1, 2], "n_prompt": 1}]  # a source that joined the stream later
    train, val = split(recs, 2)
    assert [r["id"] for r in val] == ["math:0#0", "chat:0#0", "math:1#0", "chat:1#0", "late:0#0"]
    assert [r["id"] for r in train] == [f"{src}:{i}#0" for i in range(2, 6) for src in ("math", "chat")]
    assert split(recs[:7], 2)[1] == val[:4]  # the split of a shorter stream is a prefix, per source


def test_data_plan_epochs_take_in_the_grown_stream_and_refuse_a_rewritten_one():
    from hf_dspark.training.plan import DataPlan

    recs = [{"id": f"s:{i}"} for i in range(10)]
    plan = DataPlan(recs[:6], batch_size=2, seed=0)
    first = [plan.batch(s) for s in range(3)]
    assert {r["id"] for _, b in first for r in b} == {f"s:{i}" for i in range(6)}  # epoch 0: the 6 it had
    grown = DataPlan(recs, batch_size=2, seed=0, epochs=plan.epochs)
    assert [grown.batch(s) for s in range(3)] == first  # the same batches after the stream grew
    epoch, _ = grown.batch(3)
    assert epoch == 1 and (grown.epochs[1]["start"], grown.epochs[1]["size"]) == (3, 10)
    assert {r["id"] for s in range(3, 8) for r in grown.batch(s)[1]} == {r["id"] for r in recs}
    with pytest.raises(ValueError, match="rewritten"):
        DataPlan([{"id": "other"}] + recs[1:], batch_size=2, seed=0, epochs=grown.epochs)


def _stream(counts: dict[str, int]) -> list[dict]:
    return [{"id": f"{src}:{i}#0"} for src, n in counts.items() for i in range(n)]


def test_mix_repeats_each_source_by_its_weight_per_epoch():
    from collections import Counter

    from hf_dspark.training.plan import DataPlan

    recs = _stream({"math": 20, "chat": 10, "code": 10})
    plan = DataPlan(recs, batch_size=5, seed=0, mix={"chat": 2.5, "code": 0})
    assert plan.batch(0)[0] == 0
    n = plan.steps(0)
    assert n == (20 + 25) // 5  # math ×1, chat ×2.5 (two copies and half of it sampled), code dropped
    seen = Counter(r["id"] for s in range(n) for r in plan.batch(s)[1])
    assert sum(v for k, v in seen.items() if k.startswith("chat")) == 25
    assert {v for k, v in seen.items() if k.startswith("chat")} == {2, 3}
    assert all(seen[f"math:{i}#0"] == 1 for i in range(20)) and not any(k.startswith("code") for k in seen)
    assert plan.epochs[0]["mix"] == {"chat": 2.5, "code": 0.0}
    again = DataPlan(recs, batch_size=5, seed=0, epochs=plan.epochs, mix={"chat": 2.5, "code": 0})
    assert [again.batch(s) for s in range(n)] == [plan.batch(s) for s in range(n)]  # a resume: the same batches


def test_another_mix_on_resume_opens_an_epoch_at_the_resume_step():
    from hf_dspark.training.plan import DataPlan

    recs = _stream({"math": 20, "chat": 4})
    plan = DataPlan(recs[:22], batch_size=2, seed=0)
    before = [plan.batch(s) for s in range(3)]
    resumed = DataPlan(recs, batch_size=2, seed=0, epochs=plan.epochs, mix={"chat": 3})
    assert not DataPlan(recs, batch_size=2, seed=0, epochs=plan.epochs).replan(3)  # same mixture: nothing to do
    assert resumed.replan(3)
    assert [resumed.batch(s) for s in range(3)] == before  # the steps already taken are unchanged
    assert resumed.epochs[0]["steps"] == 3 and resumed.epochs[1]["start"] == 3
    assert resumed.epochs[1]["size"] == 24 and resumed.epochs[1]["mix"] == {"chat": 3.0}
    epoch, _ = resumed.batch(3)
    assert epoch == 1 and resumed.steps(1) == (20 + 12) // 2
    chat = [r for s in range(3, 3 + resumed.steps(1)) for r in resumed.batch(s)[1] if r["id"].startswith("chat")]
    assert len(chat) == 12
    assert resumed.batch(3 + resumed.steps(1))[0] == 2  # the next epoch keeps the new mixture
    assert resumed.epochs[2]["mix"] == {"chat": 3.0}


def test_mix_refuses_a_source_the_stream_does_not_hold():
    from hf_dspark.training.plan import DataPlan

    with pytest.raises(ValueError, match="'chta'.*sources: chat, math"):
        DataPlan(_stream({"math": 2, "chat": 2}), batch_size=2, seed=0, mix={"chta": 2})


def test_mix_that_drops_every_source_is_refused_by_name():
    from hf_dspark.training.plan import DataPlan

    with pytest.raises(ValueError, match="fewer records than one batch of 2"):
        DataPlan(_stream({"math": 2, "chat": 2}), batch_size=2, seed=0, mix={"math": 0, "chat": 0})
    DataPlan(_stream({"math": 2, "chat": 2}), batch_size=2, seed=0, mix={"math": 0})  # one source left: fine


def test_grown_vocabulary_keeps_its_ids_and_adds_the_most_frequent_others():
    from hf_dspark.training.plan import grown_vocabulary

    recs = [{"ids": [4, 9, 1, 2, 2, 2, 3, 3, 5], "n_prompt": 1}, {"ids": [4, 4, 4, 6, 5], "n_prompt": 3}]
    # responses: 9 1 2 2 2 3 3 5 | 6 5 → others by count: 2 (3), 3 (2), 5 (2), then 1, 6 (ties by id); 4 is prompt only
    assert grown_vocabulary([9, 7], recs, 4) == [2, 3, 7, 9]
    assert grown_vocabulary([9, 7], recs, 5) == [2, 3, 5, 7, 9]
    assert grown_vocabulary([9, 7], recs, 7) == [1, 2, 3, 5, 6, 7, 9]
    assert grown_vocabulary([9, 7], recs, 2) == grown_vocabulary([7, 9], recs, 1) == [7, 9]
