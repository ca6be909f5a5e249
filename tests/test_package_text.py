"""Text in the package belongs to its users: no machine paths, no references to design-note sections users do not
have, no session narrative or dated compatibility notes (the research record holds the history), no hosting limits."""

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "hf_dspark"
FORBIDDEN = {
    "a machine path": re.compile(r"/(work|tmp|root|home|Users)/"),
    "a design-note section": re.compile(r"§"),
    "session narrative": re.compile(r"\b(this|last|next|earlier|a|one) session\b|\bsessions\b", re.IGNORECASE),
    "a dated note": re.compile(r"\b20[0-9]{2}-[01][0-9]-[0-3][0-9]\b|\b(legacy|deprecated since|older versions? of this)\b",
                               re.IGNORECASE),
    "a hosting limit": re.compile(r"\b45 ?MB\b|file-size limit|git host", re.IGNORECASE),
}


def test_no_machine_paths_section_numbers_or_session_words_in_the_package():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for what, pattern in FORBIDDEN.items():
                if pattern.search(line):
                    found.append(f"{path.relative_to(PACKAGE.parent)}:{n}: {what}: {line.strip()[:80]}")
    assert not found, "\n".join(found)
