"""A real Prometheus scrapes the operator while a job loses a pod (issue 41, items 2 and 3).

Prometheus (Debian's package) scrapes the operator's /metrics every second and evaluates the
chart's own rules (``files/prometheus-rules.yaml`` as ``helm template`` renders it, checked by
``promtool``). A KeepSurvivors job on kwok nodes loses a pod; rank 0's progress reports are
written as the runtime writes them. Then: every per-job series is there with the job's
values; the recovery and its lost step are observed once; and every dashboard panel's query
and every alert's expression (thresholds set so that each fires) returns data.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests import kube as k
from tests.cluster.operator_harness import (
    Jobs,
    OperatorProcess,
    exited,
    free_port,
    start_on_free_ports,
    torchjob,
)

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "torchjob-operator"
DASHBOARD = CHART / "files" / "dashboards" / "torchjob.json"
# Thresholds that make every alert fire for a healthy running job: the test asks whether each
# expression works on the real series, not whether this job deserves an alert.
FIRING = [
    "--set=metrics.prometheusRule.enabled=true",
    "--set=metrics.prometheusRule.stalledAfterSeconds=-1",
    "--set=metrics.prometheusRule.goodputBelow=2",
    "--set=metrics.prometheusRule.restartsLeft=1000",
    "--set=metrics.prometheusRule.checkpointOlderThanSeconds=-1",
]


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        msg = f"{name} is not installed (apt-get install prometheus)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI=true and {msg}", pytrace=False)
        pytest.skip(msg)
    return path


def chart_rules(tmp: Path) -> Path:
    """The chart's PrometheusRule groups as a Prometheus rule file, checked by promtool."""
    rendered = subprocess.run(
        [str(k.helm_path()), "template", "t", str(CHART), *FIRING],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    rule = next(d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "PrometheusRule")
    path = tmp / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    check = subprocess.run(
        [_binary("promtool"), "check", "rules", str(path)], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    return path


class Prometheus:
    """A real Prometheus on this machine, scraping one target every second."""

    def __init__(self, tmp: Path, target: str, rules: Path) -> None:
        self.port = free_port()
        self.rules = yaml.safe_load(rules.read_text())["groups"]
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": [
                {
                    "job_name": "torchjob-operator",
                    "honor_labels": True,  # as the chart's ServiceMonitor
                    "static_configs": [{"targets": [target]}],
                }
            ],
        }
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        # A port free_port() found free can be taken before Prometheus binds it (the CI's
        # sessions run side by side; Kueue's harness met it): then start again on a new one.
        start_on_free_ports(lambda: self._start(tmp), self._new_port)

    def _new_port(self) -> None:
        self.port = free_port()

    def _start(self, tmp: Path) -> None:
        self.log = (tmp / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            [
                _binary("prometheus"),
                f"--config.file={tmp / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        k.wait_for(self._started, 60, lambda: f"Prometheus ready\n{self.logs()}", interval=0.3)

    def _started(self) -> bool:
        """Ready; raises :func:`exited`'s error when the process ended."""
        if self.proc.poll() is not None:
            raise exited("Prometheus", self.proc.returncode, self.logs())
        return self.ready()

    def logs(self) -> str:
        return Path(self.log.name).read_text()[-3000:]

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode(
            {"query": expr}
        )
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return list(body["data"]["result"])

    def value(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self.log.close()


@pytest.fixture
def prometheus(operator: OperatorProcess, tmp_path: Path) -> Iterator[Prometheus]:
    prom = Prometheus(tmp_path, f"127.0.0.1:{operator.metrics_port}", chart_rules(tmp_path))
    yield prom
    prom.stop()


def stamp(t: datetime) -> str:
    return t.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def report(jobs: Jobs, name: str, **progress: Any) -> None:
    """Write rank 0's progress as its runtime does (a merge patch of status.progress)."""
    body = json.dumps({"status": {"progress": progress}})
    jobs.kubectl("patch", f"tj/{name}", "--subresource=status", "--type=merge", "-p", body)


def dashboard_queries() -> list[tuple[str, str]]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    out = []
    for panel in panels:
        for target in panel["targets"]:
            expr = target["expr"].replace("$namespace", ".*").replace("$job", ".*")
            out.append((panel["title"], expr))
    return out


def test_a_real_prometheus_scrapes_every_series_and_runs_every_panel_and_alert(
    jobs: Jobs, prometheus: Prometheus
) -> None:
    name = "watched"
    jobs.apply(torchjob(name, replicas=3, membershipPolicy="KeepSurvivors"))
    jobs.wait_running_pods(name, 3, 0)
    now = datetime.now(timezone.utc)
    report(
        jobs,
        name,
        step=10,
        metrics={"step": 80},  # the loop's step: 8 per report
        generation=0,
        updateTime=stamp(now),
        lastCheckpoint="/ckpt/checkpoint_000008",
        lastCheckpointTime=stamp(now - timedelta(seconds=100)),
    )
    jobs.exit_pod(f"{name}-worker-1", 1)
    jobs.wait_running_pods(name, 3, generation=1)
    # Rank 0 of generation 1 restored step 9 from memory and completed its first step.
    first = datetime.now(timezone.utc)
    report(
        jobs,
        name,
        step=10,
        metrics={"step": 80},
        generation=1,
        updateTime=stamp(first),
        restoredFrom="memory",
        restoredStep=9,
        firstStepTime=stamp(first),
    )
    status = k.wait_for(
        lambda: (
            (s := jobs.status(name)).get("history", [{}])[-1].get("recoverySeconds") is not None
            and s
        ),
        60,
        lambda: f"the history's recovery\n{jobs.status(name)}",
    )
    record = status["history"][-1]
    assert (record["generation"], record["cause"], record["stepsLost"]) == (1, "Failure", 1)
    sel = f'namespace="{jobs.ns}", torchjob="{name}"'

    def scraped(expr: str, want: float) -> bool:
        return prometheus.value(expr) == want

    expected = {
        f"torchjob_job_world_size{{{sel}}}": 3,
        f"torchjob_job_desired_pods{{{sel}}}": 3,
        f"torchjob_job_restarts_total{{{sel}}}": 1,
        f"torchjob_job_disruptions_total{{{sel}}}": 0,
        f'torchjob_job_losses_total{{{sel}, cause="Failure"}}': 1,
        f"torchjob_job_recovery_seconds_count{{{sel}}}": 1,
        f"torchjob_job_steps_lost_total{{{sel}}}": 1,
        f"torchjob_job_step{{{sel}}}": 80,
        f"torchjob_job_reports{{{sel}}}": 10,
        f"torchjob_job_restarts_allowed{{{sel}}}": 3,
        f'torchjob_job_phase{{{sel}, phase="Running"}}': 1,
    }
    for expr, want in expected.items():
        k.wait_for(
            lambda expr=expr, want=want: scraped(expr, want),  # type: ignore[misc]
            60,
            lambda expr=expr, want=want: (  # type: ignore[misc]
                f"{expr} == {want}: {prometheus.query(expr)}; up: {prometheus.query('up')}\n"
                f"{jobs.operator.scrape()[-3000:]}"
            ),
            interval=0.5,
        )
    recovery = prometheus.value(f"torchjob_job_recovery_seconds_sum{{{sel}}}")
    assert recovery is not None and recovery == pytest.approx(record["recoverySeconds"])
    assert prometheus.value(f"torchjob_job_pods_paid{{{sel}}}") == 3
    for series in ("torchjob_reconcile_duration_seconds_count", "torchjob_workqueue_depth"):
        assert prometheus.query(series), series
    # Every dashboard panel and every rule (recording and alert) returns data.
    rules = [r for g in prometheus.rules for r in g["rules"]]
    for title, expr in [
        *dashboard_queries(),
        *((r.get("alert") or r["record"], r["expr"]) for r in rules),
    ]:
        k.wait_for(
            lambda expr=expr: prometheus.query(expr),  # type: ignore[misc]
            90,
            lambda title=title, expr=expr: f"{title}: {expr} returns data",  # type: ignore[misc]
            interval=1.0,
        )
    # The rate panel draws one line per job, in the unit of its loop's step (this job
    # reports one): not a second line of its reports.
    (rate,) = [e for t, e in dashboard_queries() if t.startswith("Steps per second")]
    lines = prometheus.query(rate)
    assert [line["metric"].get("unit") for line in lines] == ["steps/s"], lines
    alerts = {r["alert"] for r in rules if "alert" in r}
    if os.environ.get("TORCHJOB_SCREENSHOTS"):  # docs/operations.md's picture of the alerts
        from tests.cluster.test_dashboard import chromium, screenshot

        with chromium() as browser:
            # Debian builds Prometheus without its React UI: the classic pages.
            browser.get(f"http://127.0.0.1:{prometheus.port}/classic/alerts")
            k.wait_for(lambda: "TorchJobStalled" in browser.page_source, 60, "the alerts page")
            screenshot(browser, "prometheus-alerts.png")
    assert len(alerts) == 4, alerts
    k.wait_for(
        lambda: {a["metric"]["alertname"] for a in prometheus.query("ALERTS")} >= alerts,
        120,
        lambda: f"every alert pending or firing: {prometheus.query('ALERTS')}",
        interval=1.0,
    )
