"""The demo as an installed package runs it: `hf-dspark demo` needs no source tree. From another directory (no
app.py, no repository on the path but the installed package), the entry point's module imports, parses its
options and builds its Gradio Blocks with the library's default controls and the quiet note."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("gradio")

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, sys
from pathlib import Path
import hf_dspark
from hf_dspark.cli import main as cli_main  # the console script's function (pyproject: hf-dspark)
from hf_dspark.cli.demo import parse_app_args
from hf_dspark.demo import app
from hf_dspark.demo.models import DemoModels, tiny_models

args = parse_app_args(["--tiny", "--tiny-steps", "0"])
models = tiny_models(steps=0)
models.info.append("head 'none' (DFlash ablation) not loaded: pass --drafter-none PATH to compare")
blocks = app.build(models, 16)
cfg = blocks.get_config_file()
comps = {c.get("props", {}).get("elem_id"): c for c in cfg["components"]}
html = " ".join(str(c.get("props", {}).get("value", "")) for c in cfg["components"])
print(json.dumps({
    "package": str(Path(hf_dspark.__file__).parent),
    "blocks": type(blocks).__name__,
    "scheduler": comps["scheduler"]["props"]["value"],
    "ngram": comps["ngram"]["props"]["value"],
    "fold": comps["fold-drafts"]["props"]["value"],
    "quiet": "quiet-note" in html,
    "cwd_has_app": Path("app.py").exists(),
}))
"""


def test_installed_demo_entry_point_builds_from_another_directory(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", GRADIO_ANALYTICS_ENABLED="False", PYTHONSAFEPATH="1")
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["blocks"] == "Blocks" and not got["cwd_has_app"]
    assert Path(got["package"]) == ROOT / "hf_dspark"  # the installed (editable) package, not a copy in cwd
    assert (got["scheduler"], got["ngram"], got["fold"]) == (True, True, False)  # the library's defaults
    assert got["quiet"]  # the missing optional drafter is a quiet line
