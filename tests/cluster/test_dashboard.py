"""``torchjob dashboard`` in a real browser (issue 41, item 4).

Debian's Chromium, driven by Selenium through Debian's chromedriver, opens the dashboard
that ``torchjob.client.dashboard.serve`` runs over the real API server with a kubeconfig.
A job loses a pod while its page is open: the loss appears on the page by itself (a marker
on the timeline with its cause, a row of the generations table). The jobs page with 100
jobs is timed in the browser (printed, never asserted), and the studies page shows a study's
trials.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from tests import kube as k
from tests.cluster.operator_harness import Jobs, torchjob
from tests.cluster.test_torchtune import study

from torchjob.client import TorchJobClient
from torchjob.client.dashboard import serve

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def _need(path: str) -> None:
    if not os.path.exists(path) and shutil.which(os.path.basename(path)) is None:
        msg = f"{path} is not installed (apt-get install chromium chromium-driver)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI=true and {msg}", pytrace=False)
        pytest.skip(msg)


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """Debian's Chromium, headless, driven by Selenium through Debian's chromedriver."""
    _need(CHROMIUM)
    _need(CHROMEDRIVER)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(flag)
    options.add_argument("--window-size=1400,1000")
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    # WebDriver's limits (30 s for a script, 300 s for a page) times CI's time scale: a
    # starved CI machine timed a script out on the 100-jobs page.
    driver.set_script_timeout(k.scaled(30))
    driver.set_page_load_timeout(k.scaled(300))
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def browser() -> Iterator[Any]:
    with chromium() as driver:
        yield driver


@pytest.fixture
def dashboard(jobs: Jobs) -> Iterator[str]:
    client = TorchJobClient(kubeconfig=str(jobs.cluster.kubeconfig), namespace=jobs.ns)
    server = serve(client, host="127.0.0.1", port=0, all_namespaces=False)
    yield f"http://127.0.0.1:{server.server_port}/"
    server.shutdown()


def screenshot(driver: Any, name: str) -> None:
    """With TORCHJOB_SCREENSHOTS=DIR, keep what the browser shows (docs/operations.md's
    pictures are made so)."""
    out = os.environ.get("TORCHJOB_SCREENSHOTS")
    if out:
        driver.save_screenshot(os.path.join(out, name))


def text_of(driver: Any, css: str) -> str:
    """The text of every element ``css`` selects, read in one script: the page re-renders
    every two seconds, so an element found in one call may be gone by the next."""
    script = (
        "return Array.from(document.querySelectorAll(arguments[0]))"
        ".map(e => e.textContent).join('\\n')"
    )
    return str(driver.execute_script(script, css))


def attribute_of(driver: Any, css: str, name: str) -> str | None:
    """An attribute of the first element ``css`` selects (None when there is none)."""
    script = (
        "const e = document.querySelector(arguments[0]); return e && e.getAttribute(arguments[1])"
    )
    found = driver.execute_script(script, css, name)
    return None if found is None else str(found)


def test_a_loss_shows_on_the_open_job_page(jobs: Jobs, browser: Any, dashboard: str) -> None:
    jobs.apply(torchjob("shown", replicas=3, membershipPolicy="KeepSurvivors"))
    jobs.wait_running_pods("shown", 3, 0)
    browser.get(dashboard + "#/jobs")
    k.wait_for(
        lambda: "Running" in text_of(browser, "table#jobs"),
        30,
        lambda: f"the jobs page showing shown Running: {text_of(browser, 'main')}",
    )
    assert f"{jobs.ns}/shown" in text_of(browser, "table#jobs")
    browser.get(dashboard + f"#/job/{jobs.ns}/shown")
    k.wait_for(lambda: text_of(browser, "table#history"), 30, "the job page's generations")
    assert not text_of(browser, "#timeline g.loss"), "no loss yet"
    lost_at = time.monotonic()
    jobs.exit_pod("shown-worker-1", 1)
    cause = k.wait_for(
        lambda: attribute_of(browser, '#timeline g.loss[data-generation="1"]', "data-cause"),
        60,
        lambda: f"the loss on the open page: {text_of(browser, 'main')}",
        interval=0.1,
    )
    print(
        f"dashboard: the pod's exit to the loss on the open page: {time.monotonic() - lost_at:.1f}s"
    )
    assert cause == "Failure"
    history = text_of(browser, "table#history")
    assert "Failure" in history and "shown-worker-1@" in history, history
    k.wait_for(
        lambda: "GenerationStarted" in text_of(browser, "table#events"),
        30,
        lambda: f"the Event on the page: {text_of(browser, 'table#events')}",
    )
    assert "Restarting" in text_of(browser, "table#conditions") or "Running" in text_of(
        browser, "table#conditions"
    )
    assert text_of(browser, "pre#log"), "rank 0's log section (kwok pods have no log: it says so)"
    screenshot(browser, "dashboard-job.png")


def test_the_jobs_page_with_100_jobs_and_the_studies_page(
    jobs: Jobs, browser: Any, dashboard: str, tmp_path: Any
) -> None:
    many = [torchjob(f"many-{i:03d}", replicas=1, runPolicy={"suspend": True}) for i in range(100)]
    path = tmp_path / "many.yaml"
    path.write_text(yaml.safe_dump_all(many))
    jobs.kubectl("apply", "-f", str(path))
    started = time.monotonic()
    browser.get(dashboard + "#/jobs")
    k.wait_for(
        lambda: text_of(browser, "h2").startswith("Jobs (100)"),
        60,
        lambda: f"100 jobs on the page: {text_of(browser, 'h2')}",
        interval=0.05,
    )
    shown = time.monotonic() - started
    render_ms = browser.execute_script("return window.lastRenderMs")
    rows = browser.execute_script("return document.querySelectorAll('table#jobs tbody tr').length")
    assert rows == 100
    print(
        f"dashboard: 100 jobs: page load to the table {shown:.2f}s; one refresh (API read "
        f"through the server, JSON, DOM) {render_ms:.0f} ms"
    )
    screenshot(browser, "dashboard-jobs.png")
    jobs.apply(study("seen"))
    browser.get(dashboard + "#/studies")
    k.wait_for(
        lambda: "trials-seen" in browser.page_source and "seen-t0" in text_of(browser, "main"),
        60,
        lambda: f"the study and its trials: {text_of(browser, 'main')}",
    )
    assert "loss (min)" in text_of(browser, "main")
    # Each trial is a TorchJob: its name opens its own page (its generations, its Events).
    browser.get(dashboard + f"#/job/{jobs.ns}/seen-t0")
    k.wait_for(
        lambda: "seen-t0" in text_of(browser, "h2") and text_of(browser, "table#history"),
        30,
        lambda: f"the trial's own page: {text_of(browser, 'main')}",
    )
