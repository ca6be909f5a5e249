"""`hf-dspark replay` end to end on a tiny target folder: τ of a drafter on the target's own greedy answers, and the
ECE of its confidences with the temperatures calibrated for the mode, beside the floor a calibrated head would show."""

import json

import torch

from hf_dspark import DSparkDrafter, cli
from tests.conftest import tiny_target


def test_replay_reports_tau_and_ece_with_the_modes_calibration(folders, tmp_path, capsys):
    target_dir, drafter_dir = folders
    target = tiny_target()  # the same seeded weights as the saved target
    drafter = DSparkDrafter.from_pretrained(drafter_dir, target=target)
    g = drafter.config.block_size
    drafter.config.calibration = [{"temperature": 0.0, "confidence_temperatures": [3.0] * g, "prefix_survival": [0.5] * g},
                                  {"temperature": 1.0, "confidence_temperatures": [0.3] * g, "prefix_survival": [0.2] * g}]
    drafter.save_pretrained(drafter_dir)
    answers = tmp_path / "answers.jsonl"
    with answers.open("w") as f:
        for i, prompt in enumerate(([5, 17, 3, 42], [8, 11, 9], [30, 2, 2, 7, 1])):
            out = target.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=24)
            f.write(json.dumps({"id": f"p:{i}#0", "temperature": 0.0, "top_p": 1.0, "prompt_ids": prompt,
                                "response_ids": out[0, len(prompt):].tolist()}) + "\n")
    out = tmp_path / "replay.json"
    argv = ["replay", str(answers), "--mode", "greedy", "--drafter", str(drafter_dir), "--target", str(target_dir),
            "--max-new-tokens", "24", "--threads", "1", "--output", str(out)]
    assert cli.main(argv) == 0
    entry = json.loads(out.read_text())["results"]["answers.jsonl"][str(drafter_dir)]
    assert entry["sequences"] == 3 and entry["tau"] >= 1.0 and entry["target_argmax_agreement"] == 1.0
    assert all(len(entry[k]) == g for k in ("ece_raw", "ece_calibrated", "ece_floor_calibrated"))
    from hf_dspark.eval.replay import replay, responses_for
    from hf_dspark.training.calibration import ece_per_position, rounds_to_arrays
    from hf_dspark.training.data import read_answers

    st = replay(DSparkDrafter.from_pretrained(drafter_dir, target=target),
                responses_for(read_answers(str(answers)), "greedy"), "greedy", 24, progress=False)
    z, y, valid = rounds_to_arrays(st.rounds, g, [3.0] * g)
    assert entry["ece_calibrated"] == ece_per_position(z, y, valid, [3.0] * g)  # the greedy entry's, not T = 1's
    assert entry["ece_calibrated"] != ece_per_position(z, y, valid, [0.3] * g)
    assert "floor" in capsys.readouterr().out
