"""The command line's manners: help on every flag with its default, one name per concept, --version, a quick
--help, and user errors as one line with exit code 2 (bugs keep their traceback)."""

import json
import subprocess
import sys
import time

import pytest

from hf_dspark import __version__, cli
from hf_dspark.cli import bench, common, demo, train

RETIRED = {"--out", "--output-dir", "--model", "--precision", "--save-to"}  # one name per concept: -o/--output etc.


def subparsers():
    parser = cli.build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return action.choices


def test_every_flag_has_help_and_one_name_per_concept():
    for name, p in subparsers().items():
        for action in p._actions:
            if action.dest == "help":
                continue
            assert action.help, f"hf-dspark {name} {action.option_strings or action.dest}: no help text"
            assert not RETIRED & set(action.option_strings), (name, action.option_strings)
        text = p.format_help()
        assert "(default:" in text, name  # the formatter shows defaults, where they say something:
        assert "(default: None)" not in text and "(default: False)" not in text, name
        formatter = p._get_formatter()
        for action in p._actions:  # and once: a help text that states its default gets no second one
            if cli.STATES_DEFAULT.search(action.help or ""):
                assert formatter._get_help_string(action) == action.help, (name, action.dest)


def test_cli_constants_are_the_librarys():
    from hf_dspark.demo.session import MAX_NEW_TOKENS
    from hf_dspark.eval.referee import TIE_TOLERANCE
    from hf_dspark.io.loading import DTYPES
    from hf_dspark.model.heads import HEADS

    assert set(train.HEAD_CHOICES) == set(HEADS)
    assert set(common.DTYPES) - {"auto"} <= set(DTYPES)
    assert demo.MAX_NEW_TOKENS == MAX_NEW_TOKENS and bench.TIE_TOLERANCE == TIE_TOLERANCE


def test_version_and_a_quick_help_without_torch():
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "hf_dspark.cli", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "generate" in r.stdout
    assert time.perf_counter() - t0 < 2.0
    code = "import sys, hf_dspark.cli as c; c.build_parser(); print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
    r = subprocess.run([sys.executable, "-m", "hf_dspark.cli", "--version"], capture_output=True, text=True)
    assert r.stdout.strip() == f"hf-dspark {__version__}"


@pytest.mark.parametrize("argv,message", [
    (["generate", "hi", "--prompts", "{tmp}/missing.jsonl", "--target", "{target}", "--drafter", "{drafter}"],
     "No such file"),
    (["generate", "--prompts", "{tmp}/bad.jsonl", "--target", "{target}", "--drafter", "{drafter}"],
     "bad.jsonl:1: not a JSON line"),
    (["generate", "--prompts", "{tmp}/noturns.jsonl", "--target", "{target}", "--drafter", "{drafter}"],
     'noturns.jsonl:1: expected {"turns"'),
    (["generate", "hi", "--target", "./no/such/target"], "target ./no/such/target: no such folder"),
    (["generate", "hi", "--target", "{target}", "--drafter", "/no/such/drafter"], "drafter /no/such/drafter: no such"),
    (["export", "{drafter}", "{tmp}/full"], "is not empty"),
    (["train", "{tmp}/missing-answers", "-o", "{tmp}/run", "--target", "{target}"], "missing-answers: no such file"),
    (["train", "{tmp}/few.jsonl", "-o", "{tmp}/run", "--target", "{target}"], "went to validation; give more answers"),
])
def test_a_user_error_is_one_line_and_exit_code_2(folders, tmp_path, capsys, argv, message):
    target, drafter = folders
    (tmp_path / "bad.jsonl").write_text('{"turns": [\n')
    (tmp_path / "noturns.jsonl").write_text(json.dumps({"text": "x"}) + "\n")
    (tmp_path / "few.jsonl").write_text("".join(json.dumps({"id": f"p:{i}#0", "prompt_ids": [1, 2],
                                                            "response_ids": [3, 4, 5]}) + "\n" for i in range(8)))
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "config.json").write_text("{}")
    argv = [a.format(tmp=tmp_path, target=target, drafter=drafter) for a in argv]
    assert cli.main(argv + (["--threads", "1"] if argv[0] == "generate" else [])) == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert "Traceback" not in err and last.startswith(f"hf-dspark {argv[0]}: error: ") and message in last, err
    assert (tmp_path / "full" / "config.json").read_text() == "{}"  # export refused before writing anything


@pytest.mark.parametrize("argv", [["train", "x", "-o", "y", "--batch-size", "0"], ["train", "x", "-o", "y",
                                  "--num-anchors", "0"], ["data", "x", "-o", "y", "--slots", "0"],
                                  ["train", "x", "-o", "y", "--max-steps", "0"], ["train", "x", "-o", "y",
                                  "--draft-vocab", "0"]])
def test_counts_that_must_be_positive_are_refused_by_argparse(argv, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2 and "must be at least 1, got 0" in capsys.readouterr().err


@pytest.mark.parametrize("spec", ["oasst_prompts", "oasst_prompts=-1", "=2", "oasst_prompts=x"])
def test_train_mix_takes_source_equals_weight(spec, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["train", "x", "-o", "y", "--mix", spec])
    assert e.value.code == 2 and f"{spec!r} is not SOURCE=WEIGHT with WEIGHT >= 0" in capsys.readouterr().err


def test_train_says_which_step_it_saved_and_which_validation_it_shows(folders, tmp_path, capsys):
    target, _ = folders
    answers = tmp_path / "a.jsonl"
    answers.write_text("".join(json.dumps({"id": f"p:{i}#0", "prompt_ids": [1, 2, 3], "response_ids": [4, 5, 6, 7]})
                               + "\n" for i in range(12)))
    argv = ["train", str(answers), "-o", str(tmp_path / "run"), "--target", str(target), "--num-layers", "1",
            "--markov-rank", "4", "--batch-size", "2", "--num-anchors", "2", "--val-size", "2", "--threads", "1",
            "--save-every", "0"]
    assert cli.main(argv + ["--max-steps", "2", "--eval-every", "1"]) == 0
    out = capsys.readouterr().out
    assert f"saved step 2 to {tmp_path / 'run' / 'checkpoint-2'}" in out and "validation at step 2:" in out
    assert cli.main(argv + ["--max-steps", "3", "--eval-every", "0"]) == 0  # a resume without validation
    out = capsys.readouterr().out
    assert "saved step 3 to" in out and "no validation this run" in out
