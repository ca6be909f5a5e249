"""training/schedule.py: a re-planned learning rate keeps the trained steps' and ends at the new total."""


def test_a_replan_continues_the_learning_rate_and_ends_at_the_new_total():
    from hf_dspark.training.schedule import lr_lambda

    plain = lr_lambda(100, 0.04)
    f = lr_lambda(100, 0.04, [{"at": 60, "from": 100, "total": 80}])
    assert f.total == 80 and [f(t) for t in range(61)] == [plain(t) for t in range(61)]  # trained steps keep theirs
    assert f(80) == 0.0 and all(f(t) > f(t + 1) for t in range(60, 80))  # no jump, then down to 0 at the new total
    longer = lr_lambda(100, 0.04, [{"at": 60, "from": 100, "total": 80}, {"at": 70, "from": 80, "total": 200}])
    assert longer(70) == f(70) and longer(80) > 0 and longer(200) == 0.0  # a later re-plan may lengthen the run
