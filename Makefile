# torchjob developer entry points. `make demo` and `make test` are the README's two commands.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP_EXTRAS ?= operator,train,dev,demo,tune
UV ?= 1
# Built control-plane binaries live outside the repo, keyed by version (see hack/versions.env).
export TORCHJOB_TESTBIN_ROOT ?= $(HOME)/.cache/torchjob/testbin

.PHONY: help
help: ## list targets
	@grep -hE '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*?## "}{printf "  %-16s %s\n", $$1, $$2}'

$(VENV)/.installed: pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; torchjob needs Python >= 3.10" >&2; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip uv
	@# uv resolves like pip and installs from its own cache (~/.cache/uv) by linking or
	@# copying unpacked wheels: a warm venv with torch takes seconds instead of pip's minutes
	@# (measured: 5 s warm, 28 s cold, against pip's 160 s). UV=0 uses pip alone.
	if [ "$(UV)" != 0 ]; then \
	  $(VENV)/bin/uv pip install -q --python $(PY) -e ".[$(PIP_EXTRAS)]"; \
	else \
	  $(PY) -m pip install -q -e ".[$(PIP_EXTRAS)]"; \
	fi
	touch $@

# Bytecode, once. uv (unlike pip) installs no .pyc files, and this machine's and CI's
# environment sets PYTHONDONTWRITEBYTECODE=1, so Python never caches what it compiles: every
# process compiled torch's ~2,500 modules from source again (import torch: 5.4 s of CPU instead
# of 2.6 s), and the tests start hundreds of worker processes. A separate stamp so that venvs
# installed before this rule get compiled too (about 40 s once; 3 s when already compiled).
$(VENV)/.bytecode: $(VENV)/.installed
	if [ "$(UV)" != 0 ]; then \
	  $(VENV)/bin/uv pip install -q --compile-bytecode --python $(PY) -e ".[$(PIP_EXTRAS)]"; \
	fi
	touch $@

.PHONY: venv
venv: $(VENV)/.installed $(VENV)/.bytecode ## create the virtual env and install torchjob with its extras

.PHONY: testbin
testbin: ## build (or reuse) the pinned control-plane binaries from the Go module proxy
	hack/build-testbin.sh

.PHONY: prereqs
prereqs: ## the Debian packages of the real node, Prometheus and Chromium (installed as root; else listed)
	hack/prereqs.sh

.PHONY: test
test: prereqs venv testbin ## run the whole suite: unit/runtime (multi-process torch), cluster, real-node and pod (own clusters) tests, five sessions at once
	PY=$(PY) hack/test.sh

.PHONY: test-cluster
test-cluster: venv testbin ## cluster tests only (control plane, operator, real node)
	$(PY) -m pytest tests/cluster

.PHONY: test-unit
test-unit: venv ## unit tests only (no cluster, no multi-process torch)
	$(PY) -m pytest tests/unit

.PHONY: lint
# mypy's and ruff's caches live outside the checkout, keyed by the tool's version, so that a
# fresh clone (CI) reuses them: a cold mypy checks torch's and pydantic's stubs too, 92 s of
# CPU beside the tests on 2 cores; warm, 2-3 s (37 s when the venv's path changed: mypy then
# rechecks the site-packages modules). Each tool validates its own entries (content hashes).
LINT_CACHE ?= $(HOME)/.cache/torchjob/lint
lint: venv ## ruff, mypy, and the chart (helm lint + checkov, hack/lint-chart.sh)
	RUFF_CACHE_DIR="$(LINT_CACHE)/ruff-$$($(VENV)/bin/ruff --version | cut -d' ' -f2)" $(VENV)/bin/ruff check .
	RUFF_CACHE_DIR="$(LINT_CACHE)/ruff-$$($(VENV)/bin/ruff --version | cut -d' ' -f2)" $(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy --cache-dir "$(LINT_CACHE)/mypy-$$($(VENV)/bin/mypy --version | cut -d' ' -f2)"
	hack/lint-chart.sh

.PHONY: fmt
fmt: venv
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

.PHONY: crds
crds: venv ## regenerate crds/ from the pydantic models in torchjob.api
	$(PY) hack/gen_crds.py

.PHONY: demo
demo: venv ## train a small model with 3 local workers, kill one midway, recover from the checkpoint
	$(PY) examples/digits/train_digits.py --workers 3 --epochs 12 --kill-at-epoch 5

.PHONY: cluster
cluster: testbin ## start the local kwok cluster (real apiserver/scheduler/controller-manager, fake GPU nodes)
	hack/cluster.sh up

.PHONY: cluster-down
cluster-down: ## delete the local cluster (its real node too; and stop a cluster-demo operator)
	-@pidfile="$$(dirname "$$(hack/cluster.sh kubeconfig)")/operator.pid"; \
	  if [ -f "$$pidfile" ] && pid="$$(cat "$$pidfile")" && kill "$$pid" 2>/dev/null; then \
	    for _ in $$(seq 100); do kill -0 "$$pid" 2>/dev/null || break; sleep 0.1; done; \
	    kill -9 "$$pid" 2>/dev/null || true; \
	  fi
	hack/cluster.sh down

.PHONY: cluster-demo
cluster-demo: venv cluster ## local cluster + CRD + operator + an example job
	hack/cluster-demo.sh

.PHONY: bench
bench: venv ## benchmarks (print figures and ratios; never part of `make test`)
	$(PY) bench/run_all.py

.PHONY: bench-sharded
bench-sharded: venv ## sharded FSDP2 checkpoints: save stall sync vs async (2 GiB over 4 ranks), resume at the same and another world size, re-form after a lost rank from the shard mirror vs storage (SHARDED_ARGS to change)
	$(PY) bench/sharded_checkpoint.py $(SHARDED_ARGS)

.PHONY: bench-goodput bench-goodput-part
# Issue 39's rows: 8 pods on 3 spot nodes (a 4th runs the operator), 256 MiB of state, the
# restore point, 10 Poisson losses per row (a pod every 60 s, a node every 120 s on average).
# GOODPUT_SPARES more real nodes stand for VMs not yet provisioned: a notice launches its
# node's replacement, Ready 60 s later, as Karpenter does (bench/goodput_fleet.py; 0: none).
GOODPUT_SPARES ?= 3
GOODPUT_ARGS ?= --system-node --shrink-on-disruption --replicas 8 --policies Elastic,Kubeflow --restore-point --state-mib 256 --step-seconds 0.5 --ckpt-every 10 --evictions 10 --mtbf 60 --node-mtbf 120 --node-return 30 --provision 60 --baseline-seconds 150
GOODPUT_ENV = TORCHJOB_CLUSTER_NAME=tj-goodput TORCHJOB_REAL_NODES=$(shell echo $$((4 + $(GOODPUT_SPARES))))
bench-goodput: venv testbin ## goodput under a fleet's losses on 4 real nodes (one a system node for the operator, the job on 3): torchjob's Elastic policy and Kubeflow's PyTorchJob, Poisson pod and node losses (eviction, SIGKILL, vanish, 30/120 s notice), 3 repeats (12-15 h on 2 cores; GOODPUT_ARGS to change, GOODPUT_MORE to add), then the recovery-vs-world-size curve (SCALE_ARGS)
	$(GOODPUT_ENV) $(PY) bench/goodput.py $(GOODPUT_ARGS) --spares $(GOODPUT_SPARES) --modes graceful,hard,vanish,notice30,notice120 $(GOODPUT_MORE)
	$(PY) bench/recovery_scale.py $(SCALE_ARGS)

MODE ?= vanish
REPEAT ?= 0
OUT ?= bench/out/goodput-parts
bench-goodput-part: venv testbin ## one part of bench-goodput (MODE, REPEAT 0-2, into OUT/MODE-REPEAT; both systems, their own baselines; the hard part measures the restore point's overhead too): read the parts as one table with bench/goodput_recompute.py OUT/* --workers 8
	$(GOODPUT_ENV) $(PY) bench/goodput.py $(GOODPUT_ARGS) --spares $(GOODPUT_SPARES) --modes $(MODE) --repeats 1 --repeat-from $(REPEAT) $(if $(filter hard,$(MODE)),,--no-restore-point-baseline) --out $(OUT)/$(MODE)-$(REPEAT) $(GOODPUT_MORE)

.PHONY: bench-scale
bench-scale: venv ## recovery after a SIGKILLed rank vs world size: 2, 8, 32, 64 local gloo ranks, replace and shrink; table + SVG curve in bench/out/scale (SCALE_ARGS to change)
	$(PY) bench/recovery_scale.py $(SCALE_ARGS)

.PHONY: bench-quickstart
QUICKSTART_ARGS ?= --repeats 5 --epochs 60 --starts zygote,spawn --paths pod
bench-quickstart: venv ## the Ray Train quickstart vs torchrun: wall, CPU and start-up (runs in turn), then the training phase with both sides taking turns epoch by epoch (QUICKSTART_ARGS to change; about 25 min)
	$(PY) bench/quickstart_vs_torchrun.py $(QUICKSTART_ARGS)
	$(PY) bench/quickstart_vs_torchrun.py $(QUICKSTART_ARGS) --interleave

.PHONY: bench-operator
BENCH_ARGS ?= --sizes 20,100,500 --scale-jobs 1000
bench-operator: venv testbin ## operator cost: torchjob vs Kubeflow training-operator v1.8.1 on a private kwok cluster, then 1000 TorchJobs (45 min or more; BENCH_ARGS to change)
	$(PY) bench/operator_vs_kubeflow.py $(BENCH_ARGS)

.PHONY: kubectl-plugin
kubectl-plugin: venv ## the kubectl plugin for krew: dist/kubectl-torchjob_linux_amd64.tar.gz (CPython 3.10-3.13 zipapps) and its manifest dist/krew/torchjob.yaml
	PY=$(PY) hack/kubectl-plugin.sh

.PHONY: images
images: ## build the operator and CPU runtime images with docker or podman (IMAGES="operator runtime" for the CUDA one)
	hack/images.sh build $(IMAGES)

.PHONY: node-images
NODE_IMAGES = operator runtime-cpu pause
node-images: images ## the real nodes' images as archives, imported and unpacked once into the seeded containerd root every real node starts from (what the first real-node test session would do)
	@if [ "$$(id -u)" = 0 ] && command -v containerd >/dev/null && command -v ctr >/dev/null; then \
	  tars="$$(for i in $(NODE_IMAGES); do hack/images.sh save "$$i" | tail -n 1; done)" && \
	  hack/node.sh seed $$tars; \
	else echo "node-images: seeding needs root, containerd and ctr (hack/prereqs.sh): not seeded"; fi

.PHONY: images-push
images-push: ## push the images to IMAGE_REPO (e.g. make images-push IMAGE_REPO=ghcr.io/me)
	hack/images.sh push $(IMAGES)

.PHONY: node
node: cluster ## join a real node (kubelet + containerd, hack/node.sh) to the local cluster
	hack/images.sh build operator runtime-cpu pause
	tars="$$(for i in operator runtime-cpu pause; do hack/images.sh save $$i | tail -n 1; done)" && \
	  hack/node.sh up $$tars && hack/node.sh import $$tars

.PHONY: cluster-nodes
REAL_NODES ?= 3
cluster-nodes: cluster ## the local cluster with REAL_NODES real nodes (default 3, at most 8: kubelet + containerd each, hack/node.sh), the images in each
	hack/images.sh build operator runtime-cpu pause
	tars="$$(for i in operator runtime-cpu pause; do hack/images.sh save $$i | tail -n 1; done)" && \
	  TORCHJOB_REAL_NODES=$(REAL_NODES) hack/node.sh up $$tars && hack/node.sh import $$tars

.PHONY: e2e-kind
e2e-kind: ## end-to-end on kind (needs Docker; skips with a message without it)
	hack/e2e-kind.sh
