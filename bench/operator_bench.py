"""One burst of the operator benchmark: N jobs submitted at once, timed to every pod created,
Running and every job Running, the operators' CPU and RSS, then the reactions and the idle
request rates (bench/operator_vs_kubeflow.py runs it)."""

from __future__ import annotations

import argparse
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.harness import Proc, has_default_sa, log, wait_for
from bench.operator_agents import Agents
from bench.operator_jobs import (
    EXIT_CODE_ANNOTATION,
    KF,
    PODS_PER_JOB,
    TJ,
    Flavor,
    apiserver_requests,
)
from bench.operator_observer import Observer


@dataclass
class Bench:
    args: argparse.Namespace
    kubeconfig: Path
    api: Any
    procs: dict[str, Proc]
    tj_metrics_port: int = 0
    results: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    seq: int = 0

    def tj_counters(self) -> dict[str, float]:
        """torchjob's own counters (its /metrics): what each reconcile cost in requests."""
        wanted = {
            "torchjob_reconciles_total": "reconciles",
            "torchjob_status_patches_total": "status patches",
            'torchjob_live_reads_total{kind="job"}': "live GETs",
            'torchjob_live_reads_total{kind="pods"}': "live LISTs",
        }
        out = dict.fromkeys(wanted.values(), 0.0)
        if not self.tj_metrics_port:
            return out
        url = f"http://127.0.0.1:{self.tj_metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            for line in r.read().decode().splitlines():
                name, _, value = line.rpartition(" ")
                if name in wanted:
                    out[wanted[name]] = float(value)
        return out

    def record(self, key: str, flavor: str, value: float) -> None:
        self.results.setdefault((key, flavor), []).append(value)

    def other(self, flavor: Flavor) -> Flavor:
        return KF if flavor is TJ else TJ

    def burst(self, flavor: Flavor, n: int, repeat: int, react: bool, idle: bool) -> None:
        from kubernetes import client

        core, custom = client.CoreV1Api(self.api), client.CustomObjectsApi(self.api)
        self.seq += 1
        ns = f"bench-{flavor.key}-{n}-{self.seq}"
        core.create_namespace({"metadata": {"name": ns}})
        wait_for(f"ServiceAccount default in {ns}", lambda: has_default_sa(core, ns), 60, 0.1)
        obs = Observer(self.api, ns, flavor).start()
        me, them = self.procs[flavor.key], self.procs[self.other(flavor).key]
        cpu0, other0 = me.cpu_s(), them.cpu_s()
        counters0 = self.tj_counters()
        names = [f"job-{i:04d}" for i in range(n)]
        t0 = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            list(
                pool.map(
                    lambda j: custom.create_namespaced_custom_object(
                        flavor.group, flavor.version, ns, flavor.plural, flavor.manifest(j)
                    ),
                    names,
                )
            )
        submitted = time.monotonic() - t0
        pods = n * PODS_PER_JOB
        timeout = 120 + 1.0 * pods
        wait_for(f"{pods} {flavor.label} pods", lambda: len(obs.pods) >= pods, timeout, 0.1)
        t_created = max(p.seen for p in obs.snapshot()) - t0
        wait_for(
            f"{pods} Running {flavor.label} pods",
            lambda: sum(1 for p in obs.snapshot() if p.running) >= pods,
            timeout,
            0.1,
        )
        t_running = max(p.running or 0 for p in obs.snapshot()) - t0
        wait_for(f"{n} Running jobs", lambda: len(obs.jobs_running) >= n, timeout, 0.1)
        with obs.lock:
            t_jobs = max(obs.jobs_running.values()) - t0
        time.sleep(2)  # let the last status writes land, then count the CPU
        cpu = me.cpu_s() - cpu0
        foreign = them.cpu_s() - other0
        rss_loaded = me.rss_mib()
        log(
            f"{flavor.label} N={n} (run {repeat + 1}): submitted in {submitted:.1f}s, pods "
            f"created {t_created:.1f}s, Running {t_running:.1f}s, jobs Running {t_jobs:.1f}s, "
            f"CPU {cpu:.1f}s (the other operator meanwhile {foreign:.1f}s), RSS {rss_loaded:.0f} MiB"
        )
        if flavor is TJ:
            counted = self.tj_counters()
            log(
                "torchjob per job in the burst: "
                + ", ".join(f"{(counted[k] - counters0[k]) / n:.2f} {k}" for k in counted)
            )
        key = f"n{n}"
        self.record(f"{key}.created", flavor.key, t_created)
        self.record(f"{key}.running", flavor.key, t_running)
        self.record(f"{key}.jobs", flavor.key, t_jobs)
        self.record(f"{key}.pods_per_s", flavor.key, pods / t_created)
        self.record(f"{key}.cpu", flavor.key, cpu)
        self.record(f"{key}.cpu_per_pod_ms", flavor.key, 1000 * cpu / pods)
        self.record(f"{key}.foreign_cpu", self.other(flavor).key, foreign)
        self.record(f"{key}.rss_loaded", flavor.key, rss_loaded)
        if react:
            self.reactions(flavor, obs, core, ns, names)
        if idle and self.args.idle_window > 0:
            self.idle_requests(flavor, obs, core, ns, names)
        # Delete every job and wait for its pods to go; then the memory should be back.
        t_del = time.monotonic()
        self.delete_jobs(custom, flavor, ns)
        wait_for(f"{flavor.label} pods deleted", lambda: obs.live_count() == 0, 120 + pods, 0.2)
        log(f"{flavor.label}: {pods} pods deleted in {time.monotonic() - t_del:.1f}s")
        obs.stop()
        core.delete_namespace(ns)
        time.sleep(self.args.settle)
        self.record("rss_after_delete", flavor.key, me.rss_mib())
        log(
            f"{flavor.label}: RSS {me.rss_mib():.0f} MiB after the deletion; CPU so far: torchjob "
            f"{self.procs['tj'].cpu_s():.1f}s, Kubeflow {self.procs['kf'].cpu_s():.1f}s"
        )

    @staticmethod
    def delete_jobs(custom: Any, flavor: Flavor, ns: str) -> None:
        """Delete every job of ``ns``. A loaded API server answers a deletecollection of 1000
        jobs with 504 while it goes on deleting: ask again until none is left."""
        from kubernetes import client

        deadline = time.monotonic() + 900
        while True:
            try:
                custom.delete_collection_namespaced_custom_object(
                    flavor.group, flavor.version, ns, flavor.plural, propagation_policy="Background"
                )
            except client.ApiException as e:
                if e.status not in (500, 504) or time.monotonic() > deadline:
                    raise
                log(f"deleting the {flavor.label} jobs: {e.status} {e.reason}; asking again")
                continue
            left = custom.list_namespaced_custom_object(
                flavor.group, flavor.version, ns, flavor.plural, limit=1
            )
            if not left.get("items") or time.monotonic() > deadline:
                return
            time.sleep(1)

    def _react(
        self,
        what: str,
        flavor: Flavor,
        obs: Observer,
        ns: str,
        jobs: list[str],
        pod_of: Callable[[str], str],
        act: Callable[[str], None],
        concurrent: bool,
    ) -> None:
        """Do ``act`` to one pod of each job; time until the job has all pods Running again."""
        out: list[float] = []

        def one(job: str) -> None:
            pod = pod_of(job)
            uid = obs.uid_of(pod)
            t0 = time.monotonic()
            act(pod)
            wait_for(
                f"{what} of {ns}/{pod} recovered",
                lambda: len(obs.live_running(job, frozenset({uid}))) >= PODS_PER_JOB,
                120,
                0.01,
            )
            out.append(time.monotonic() - t0)

        if concurrent:
            with ThreadPoolExecutor(len(jobs)) as pool:
                list(pool.map(one, jobs))
        else:
            for job in jobs:
                one(job)
        for x in out:
            self.record(what, flavor.key, x)
        log(f"{flavor.label} {what}: " + ", ".join(f"{x:.2f}s" for x in sorted(out)))

    def reactions(
        self, flavor: Flavor, obs: Observer, core: Any, ns: str, names: list[str]
    ) -> None:
        from kubernetes import client

        k = self.args.react_jobs
        fail_jobs, evict_jobs, rank0_jobs = names[:k], names[k : k + 2 * k], names[3 * k : 4 * k]

        def exit_nonzero(pod: str) -> None:
            body = {"metadata": {"annotations": {EXIT_CODE_ANNOTATION: str(flavor.exit_code)}}}
            core.patch_namespaced_pod(pod, ns, body)

        def evict(pod: str) -> None:
            core.create_namespaced_pod_eviction(
                pod, ns, client.V1Eviction(metadata=client.V1ObjectMeta(name=pod, namespace=ns))
            )

        def delete(pod: str) -> None:
            core.delete_namespaced_pod(pod, ns)

        self._react("failure", flavor, obs, ns, fail_jobs, flavor.worker, exit_nonzero, True)
        self._react("eviction", flavor, obs, ns, evict_jobs, flavor.worker, evict, False)
        self._react("rank0", flavor, obs, ns, rank0_jobs, flavor.rank0, delete, True)

    def idle_requests(
        self, flavor: Flavor, obs: Observer, core: Any, ns: str, names: list[str]
    ) -> None:
        """Requests/s of the idle jobs: API server metrics minus the agents' own count."""
        time.sleep(self.args.settle)
        agents = Agents(self.api, core, ns, names[-1]) if flavor is TJ else None
        try:
            if agents:
                agents.start()
                time.sleep(2)  # the agents' start-up reads are not idle load
            before, sent0 = apiserver_requests(self.kubeconfig), agents.sent() if agents else 0
            t0 = time.monotonic()
            time.sleep(self.args.idle_window)
            after, sent1 = apiserver_requests(self.kubeconfig), agents.sent() if agents else 0
            window = time.monotonic() - t0
        finally:
            if agents:
                agents.stop()
        agent_reqs = sent1 - sent0
        operator_rate = (after - before - agent_reqs) / window
        jobs = len(names)
        self.record("idle_operator_req_per_s_per_job", flavor.key, operator_rate / jobs)
        self.record("idle_agent_req_per_s_per_pod", flavor.key, agent_reqs / window / PODS_PER_JOB)
        log(
            f"{flavor.label} idle over {window:.0f}s with {jobs} jobs: operator "
            f"{operator_rate:.2f} req/s, agents of one job {agent_reqs / window:.2f} req/s"
        )
