"""End to end in a real browser: app.py (tiny seeded models) on 127.0.0.1, driven by Playwright in Debian's
Chromium. Skips only when /usr/bin/chromium is absent (CI installs it: apt-get install -y chromium).

The README's picture comes from the real SmolLM2 instead: test_app_smollm2_e2e.py.
"""

import pytest

from tests.demo._browser import CHROMIUM, FLAGS, needs_chromium, served_app

EVIL = 'Explain <script>alert("pwned")</script> & drafts'

pytestmark = needs_chromium


@pytest.fixture(scope="module")
def app_url(tmp_path_factory):
    log = tmp_path_factory.mktemp("app") / "app.log"
    # first start builds and caches the tiny models (~1 min on a busy CPU)
    with served_app(["--tiny", "--threads", "1", "--max-new-tokens", "64"], log, wait_s=300) as url:
        yield url


@pytest.fixture(scope="module")
def page(app_url):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        pg = browser.new_page(viewport={"width": 1400, "height": 1000})
        pg.dialogs = []  # an alert() would mean injected script ran
        pg.on("dialog", lambda d: (pg.dialogs.append(d.message), d.dismiss()))
        pg.goto(app_url)
        yield pg
        browser.close()


def test_generate_streams_coloured_tokens_and_stats(page, tmp_path):
    # the page opens with the library's defaults: scheduler + draft gate and n-gram drafts on, drafts unfolded
    assert page.locator("#scheduler input[type=checkbox]").is_checked()
    assert page.locator("#ngram input[type=checkbox]").is_checked()
    assert not page.locator("#fold-drafts input[type=checkbox]").is_checked()
    assert page.locator(".untrained").count() <= 1  # the tiny model's one caveat; nothing else shouts
    page.locator("#prompt textarea").fill(EVIL)
    page.locator("#generate-btn").click()
    page.locator("#answer .streaming, #answer .stream-done").first.wait_for(timeout=60_000)
    page.locator("#answer .stream-done").wait_for(timeout=180_000)
    tokens = page.locator("#answer .tokens .tok")
    assert tokens.count() > 10
    committed = page.locator("#answer .tokens .tok-accepted, #answer .tokens .tok-target").count()
    assert committed >= 10
    assert page.locator("#answer .tokens .tok-target").count() >= 1
    assert page.locator("#answer .tokens .tok-accepted").count() >= 1, "the trained tiny drafter accepts some drafts"
    title = page.locator("#answer .tokens .tok-accepted").first.get_attribute("title")
    assert "predicted survival c=" in title and "accepted" in title
    # the prompt is shown as text: the script tag is visible, never executed or parsed
    assert EVIL in page.locator("#answer .prompt").inner_text()
    assert page.locator("#answer script").count() == 0 and page.dialogs == []
    stats = page.locator("#stats").inner_text()
    assert "τ" in stats and "tokens/s" in stats and "verify lengths" in stats
    assert page.locator("#stats svg.bars").count() == 2
    page.screenshot(path=str(tmp_path / "generate.png"), full_page=True)


def test_rejected_drafts_fold_away(page):
    """Verify-all (scheduler off) on the tiny drafter rejects drafts; the fold box hides them, at once and in the
    answer already shown, leaving the committed tokens; unfolding shows them again."""
    prompt = "The target verifies the block in one pass."
    page.locator("#prompt textarea").fill(prompt)
    page.locator("#scheduler input[type=checkbox]").uncheck()
    page.locator("#ngram input[type=checkbox]").uncheck()
    page.locator("#generate-btn").click()
    # the previous test's answer is still on the page, done: wait for this prompt's answer to be the one shown
    page.locator("#answer .prompt", has_text=prompt).wait_for(timeout=60_000)
    page.locator("#answer .stream-done").wait_for(timeout=180_000)
    discarded = page.locator("#answer .tokens .tok-rejected, #answer .tokens .tok-trimmed")
    committed = page.locator("#answer .tokens .tok-accepted, #answer .tokens .tok-target")
    assert discarded.count() > 0 and discarded.first.is_visible()
    page.locator("#fold-drafts input[type=checkbox]").check()
    assert not any(discarded.nth(i).is_visible() for i in range(discarded.count()))
    # every committed token with text stays on screen (a bare "\n" token has an empty box even when shown)
    texts = committed.all_inner_texts()
    shown = [committed.nth(i).is_visible() for i, t in enumerate(texts) if t.strip()]
    assert shown and all(shown), texts
    page.locator("#fold-drafts input[type=checkbox]").uncheck()
    assert discarded.first.is_visible()
    page.locator("#scheduler input[type=checkbox]").check()  # back to the defaults for the next test
    page.locator("#ngram input[type=checkbox]").check()


def test_race_reports_both_speeds_and_greedy_identity(page, tmp_path):
    page.locator("#prompt textarea").fill("The drafter proposes a block of tokens.")
    page.locator("#scheduler input[type=checkbox]").check()  # ℓ chosen from c_k (the device profile is measured once)
    page.locator("#ngram input[type=checkbox]").check()  # and n-gram drafts where the context repeats
    page.locator("#race-btn").click()
    page.locator("#race .dspark-race .identical").wait_for(timeout=180_000)
    race = page.locator("#race").inner_text()
    assert "tok/s" in race and "greedy texts identical ✓" in race, race
    assert "scheduler + draft gate (default) + n-gram drafts" in page.locator("#stats").inner_text()
    assert page.dialogs == []
    shot = tmp_path / "race.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
