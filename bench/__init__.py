"""torchjob's benchmarks: each prints figures and ratios, asserts nothing and never runs in
``make test`` (bench/README.md lists them and their Makefile targets).

The entry points run as scripts (``python bench/goodput.py``, as the Makefile does) or as
modules (``python -m bench.goodput``). What they share is in :mod:`bench.harness`: the
cluster, kubectl and CRDs, operator processes, waits, the statistics over repeats and
the raw result files (``*.jsonl.gz`` in bench/results, read transparently). The workers that
run inside pods (``_goodput_*.py``) stay plain scripts: a pod mounts the folder, not the
package.
"""
