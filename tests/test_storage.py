"""Where hf_dspark stores what it measures, and its atomic writes (storage.py)."""

from concurrent.futures import ThreadPoolExecutor

from hf_dspark.storage import storage_dir, write_atomic


def test_storage_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_DSPARK_CACHE", str(tmp_path))
    assert storage_dir() == tmp_path
    monkeypatch.delenv("HF_DSPARK_CACHE")
    assert storage_dir().parts[-2:] == (".cache", "hf_dspark")


def test_writers_of_one_path_at_once_all_succeed(tmp_path):
    """Each writer has a temporary file of its own and replaces atomically (two processes measuring one device
    profile, parallel test workers): none fails, the file is one writer's whole text, no temporary is left."""
    path = tmp_path / "sub" / "p.json"
    texts = [f'{{"writer": {i}, "pad": "{"x" * 20_000}"}}' for i in range(64)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda t: write_atomic(path, t), texts))  # raises here if a writer failed
    assert path.read_text() in texts
    assert [f.name for f in path.parent.iterdir()] == ["p.json"]
