"""`hf-dspark calibrate` end to end on a tiny target folder: each temperature it is run at becomes its own entry of
config.calibration (greedy and T = 1 side by side), with a report and a reliability plot per temperature."""

import copy
import json

from hf_dspark import DSparkDrafter, cli
from tests.conftest import tiny_target


def test_calibrating_at_two_temperatures_keeps_an_entry_for_each(folders, char_tokenizer, tmp_path, capsys):
    target, drafter = folders
    tok = copy.deepcopy(char_tokenizer)
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    tok.save_pretrained(target)
    prompts = tmp_path / "held_out.jsonl"
    prompts.write_text("".join(json.dumps({"turns": [t]}) + "\n" for t in ("hello there", "abc abc abc", "zz top")))
    out = tmp_path / "calibrated"
    for t in ("0", "1"):
        src = drafter if t == "0" else out
        argv = ["calibrate", str(src), str(prompts), "--target", str(target), "--limit", "3", "--max-new-tokens", "12",
                "--temperature", t, "--threads", "1", "-o", str(out)]
        assert cli.main(argv) == 0
        assert (out / f"calibration_T{t}.json").exists() and (out / f"reliability_T{t}.png").exists()
    assert "calibrated at T = 0, 1" in capsys.readouterr().out
    saved = DSparkDrafter.from_pretrained(out, target=tiny_target())
    entries = saved.config.calibration
    assert [c["temperature"] for c in entries] == [0.0, 1.0]
    report = json.loads((out / "calibration_T0.json").read_text())
    assert entries[0]["confidence_temperatures"] == report["temperatures"]
    assert saved.config.confidence_temperatures == entries[1]["confidence_temperatures"]  # the last fit's
