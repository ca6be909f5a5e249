"""hf_dspark/ngram.py: the n-gram index against a brute-force search, grown in random chunks (a prompt, then
rounds of 1-8 tokens)."""

import random

import pytest

from hf_dspark.decoding.ngram import NgramIndex


def brute_force(seq, num, min_ngram=2, max_ngram=4, answer_start=0):
    """The tokens after the latest earlier occurrence of the longest suffix n-gram (max..min, within
    seq[answer_start:]), or []."""
    end = len(seq)
    for n in range(min(max_ngram, end - 1, end - answer_start), min_ngram - 1, -1):
        for start in range(end - n - 1, -1, -1):  # occurrences ending before the last token, latest first
            if seq[start:start + n] == seq[end - n:]:
                return seq[start + n:start + n + num]
    return []


@pytest.mark.parametrize("vocab", [2, 3, 6, 50])
def test_matches_brute_force_as_the_sequence_grows(vocab):
    rng = random.Random(vocab)
    for _ in range(20):
        idx, seq = NgramIndex(), []
        while len(seq) < 160:
            size = rng.randint(1, 60) if not seq else rng.randint(1, 8)  # the prompt, then 1..8 tokens a round
            chunk = [rng.randrange(vocab) for _ in range(size)]
            seq += chunk
            idx.extend(chunk)
            num = rng.randint(0, 9)
            assert idx.draft(num) == brute_force(seq, num), (seq, num)


def test_longest_and_latest_match_wins():
    idx = NgramIndex()
    idx.extend([7, 1, 2, 3, 9, 9, 2, 3, 4, 4, 1, 2, 3])
    assert idx.draft(2) == [9, 9]  # (1, 2, 3) occurred at 1..3; the later (2, 3) at 6..7 is a shorter match
    idx.extend([4])
    assert idx.draft(5) == [4, 1, 2, 3, 4]  # the 3-gram (2, 3, 4) at 6..8; may run up to the last token
    assert idx.draft(9) == [4, 1, 2, 3, 4]  # and no further


def test_single_token_matches_are_not_drafted():
    idx = NgramIndex()
    idx.extend([1, 2, 3, 1])
    assert idx.draft(4) == []  # only the 1-gram (1,) recurs
    idx = NgramIndex(min_ngram=1)
    idx.extend([1, 2, 3, 1])
    assert idx.draft(4) == [2, 3, 1]


def test_bad_sizes_are_named():
    with pytest.raises(ValueError, match="min_ngram"):
        NgramIndex(min_ngram=3, max_ngram=2)
    with pytest.raises(ValueError, match="min_ngram"):
        NgramIndex(min_ngram=0)


def test_the_matched_suffix_lies_in_the_answer():
    """After a prompt, a suffix that reaches back into it (the template's last token + the answer's first) is not
    looked up; once the answer holds the n-gram itself it is, against the whole sequence."""
    idx = NgramIndex()
    prompt = [5, 1, 2, 3, 4, 9, 1]  # ... "\n"=1 then the answer starts
    idx.extend(prompt)
    idx.answer_start = len(prompt)
    idx.extend([2])  # the answer's first token: the 2-gram (1, 2) occurred in the prompt, but reaches into it
    assert idx.draft(3) == []
    idx.extend([3])  # (2, 3) lies in the answer and occurred in the prompt
    assert idx.draft(3) == [4, 9, 1]
    whole = NgramIndex()
    whole.extend(prompt + [2])
    assert whole.draft(3) == [3, 4, 9]  # answer_start 0: anywhere, as before
