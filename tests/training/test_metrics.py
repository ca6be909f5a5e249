"""training/metrics.py: metrics.jsonl is appended to as a run goes and cut back to the step a run resumes from."""

from hf_dspark.training import metrics


def test_append_cut_back_and_a_line_cut_by_a_kill_is_skipped(tmp_path):
    for step in (0, 100, 200, 300):
        metrics.append(tmp_path, {"step": step, "loss": 1.0 / (step + 1)})
    with open(tmp_path / metrics.FILE, "a") as f:
        f.write('{"step": 40')  # a kill mid-write
    assert metrics.logged_steps(tmp_path) == [0, 100, 200, 300]
    metrics.keep_until(tmp_path, 200)  # the run resumes from checkpoint-200: later records will be redone
    assert metrics.logged_steps(tmp_path) == [0, 100, 200]
    metrics.append(tmp_path, {"step": 300, "loss": 0.5})
    assert metrics.logged_steps(tmp_path) == [0, 100, 200, 300]
    metrics.keep_until(tmp_path, 0)
    assert metrics.logged_steps(tmp_path) == [0]


def test_no_file_yet_means_no_steps(tmp_path):
    assert metrics.logged_steps(tmp_path) == []
    metrics.keep_until(tmp_path, 0)
    assert not (tmp_path / metrics.FILE).exists()
