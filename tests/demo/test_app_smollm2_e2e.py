"""The demo as a visitor meets it: `app.py` with no options (the embedded SmolLM2-135M-Instruct and the shipped
drafter, float32, the library's default controls) in Debian's Chromium. The page must show the real model's
words: a greedy prompt's known answer, read with rejected drafts folded away. Skips without /usr/bin/chromium.

HF_DSPARK_UPDATE_SCREENSHOT=1 also copies a screenshot of a GSM8K-style answer (rejected drafts folded away) to
docs/demo.png (the README's picture).
"""

import os
import shutil

import pytest

from tests.demo._browser import CHROMIUM, FLAGS, ROOT, needs_chromium, served_app

pytestmark = needs_chromium

CAPITAL = "What is the capital of France?"
EXPECTED = "The capital of France is Paris."  # plain greedy generate's answer in float32 (the target alone)
NATALIA = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
           "How many clips did Natalia sell altogether in April and May?")


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    from playwright.sync_api import sync_playwright

    log = tmp_path_factory.mktemp("app") / "app.log"
    # first start: converts SmolLM2 and measures its device profile (once)
    with served_app(["--threads", "1", "--max-new-tokens", "64"], log, wait_s=420) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        pg = browser.new_page(viewport={"width": 1400, "height": 1000})
        pg.goto(url)
        yield pg
        browser.close()


def _generate(page, prompt: str) -> None:
    page.locator("#prompt textarea").fill(prompt)
    page.locator("#generate-btn").click()
    # this prompt's answer (not the previous one), then its end
    page.locator("#answer .prompt", has_text=prompt[:40]).wait_for(timeout=60_000)
    page.locator("#answer .stream-done").wait_for(timeout=300_000)


def test_real_model_answers_in_real_words(page):
    assert page.locator(".untrained").count() == 0  # the shipped drafter is trained: no warning on the page
    assert page.locator("#scheduler input[type=checkbox]").is_checked()
    assert page.locator("#ngram input[type=checkbox]").is_checked()
    _generate(page, CAPITAL)
    page.locator("#fold-drafts input[type=checkbox]").check()
    text = page.locator("#answer .tokens").inner_text()  # innerText skips the folded (display: none) drafts
    assert text.strip().startswith(EXPECTED), text
    page.locator("#fold-drafts input[type=checkbox]").uncheck()
    assert "scheduler + draft gate (default) + n-gram drafts" in page.locator("#stats").inner_text()


def test_screenshot_of_a_gsm8k_style_answer(page, tmp_path):
    _generate(page, NATALIA)
    page.locator("#fold-drafts input[type=checkbox]").check()  # the picture shows the answer as text, coloured
    assert page.locator("#answer .tokens").inner_text().strip().startswith("Natalia sold 48 clips in April")
    shot = tmp_path / "demo.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    if os.environ.get("HF_DSPARK_UPDATE_SCREENSHOT"):
        shutil.copy(shot, ROOT / "docs" / "demo.png")
