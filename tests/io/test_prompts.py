"""io/prompts.py: the one prompt reader (ids, formats, named errors) and the one chat encoder."""

import copy
import json

import pytest

from hf_dspark.io.prompts import chat_ids, chat_inputs, read_prompts


def test_jsonl_and_text_prompts_with_line_ids(tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"turns": ["Hi", "later"]}) + "\n\n" + json.dumps({"prompt": "Bye"}) + "\n")
    assert read_prompts(path) == [("chat:0", "Hi"), ("chat:2", "Bye")]  # blank lines keep their index
    text = tmp_path / "mine.txt"
    text.write_text("first prompt\n{not json, but a text file}\n")
    assert read_prompts(text) == [("mine:0", "first prompt"), ("mine:1", "{not json, but a text file}")]


@pytest.mark.parametrize("content,message", [
    (b'{"turns": ["ok"]}\n{"turns": [\n', r"bad\.jsonl:2: not a JSON line"),
    (b'{"text": "no turns"}\n', r"bad\.jsonl:1: expected \{\"turns\""),
    (b'["a list"]\n', r"bad\.jsonl:1: expected"),
    (b"\n\n", r"bad\.jsonl holds no prompts"),
    (b"\xff\xfe\x00binary", r"bad\.jsonl is not a UTF-8 text file"),
])
def test_a_bad_prompt_file_is_named_with_its_line(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=message):
        read_prompts(path)


def test_chat_encoding_is_the_template_with_the_assistant_header(char_tokenizer):
    """Without a chat template: the tokenizer's plain encoding; with one: apply_chat_template's ids."""
    tok = copy.deepcopy(char_tokenizer)  # the fixture is shared: other tests give it a template
    tok.chat_template = None
    assert chat_ids(tok, "ab c") == tok("ab c")["input_ids"]
    inputs = chat_inputs(tok, "ab c")
    assert inputs["input_ids"].tolist() == [chat_ids(tok, "ab c")]
    assert inputs["attention_mask"].tolist() == [[1] * 4]
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}.{% endfor %}{{ 'A' }}"
    assert chat_ids(tok, "ab") == tok("ab.A")["input_ids"]
