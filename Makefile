# The two commands a newcomer runs are `make run` and `make test` (see README.md).
SHELL := /bin/bash
PY := .venv/bin/python

.PHONY: run test lint unit bootstrap lock lock-upgrade cluster-up cluster-down crd manifests plugin bench-sync bench-sync-real bench-control-plane bench-manifest bench-inplace bench-tune bench-real-size

bootstrap:
	@e2e/bootstrap

## The hash-pinned installs, requirements/{build,test,runtime}.lock, from pyproject.toml (uv, pinned in
## e2e/locks.py): lock keeps every pin that still fits; lock-upgrade takes the newest versions allowed.
lock:
	python3 e2e/locks.py compile

lock-upgrade:
	python3 e2e/locks.py compile --upgrade

## The main job: local cluster (unless KUBECONFIG is set), CRD, operator, an example TritonService.
run: bootstrap
	@$(PY) e2e/run.py

## The tests: lint, type checks, import contracts, then every test against real parts
## (a local Kubernetes brought up for the run and down after, real tritonserver, S3, GCS, Azure).
test: bootstrap
	@e2e/test

lint: bootstrap
	.venv/bin/ruff check --no-cache operator tests e2e bench
	.venv/bin/ruff format --no-cache --check operator tests e2e bench
	.venv/bin/mypy
	.venv/bin/lint-imports

unit: bootstrap
	.venv/bin/pytest tests/unit -q

cluster-up: bootstrap
	@python3 e2e/cluster.py up

cluster-down:
	@python3 e2e/cluster.py down

crd: bootstrap
	.venv/bin/triton-operator crd --output crds/tritonservices.yaml
	charts/generate-manifests

manifests: bootstrap
	charts/generate-manifests

## The single-file kubectl plugin (a zipapp of what the plugin imports): dist/kubectl-triton.
plugin: bootstrap
	PYTHONPATH=operator/src $(PY) e2e/build_plugin.py --output dist/kubectl-triton

bench-sync: bootstrap
	$(PY) bench/sync/run.py

## The full-size generated repository (2.5 GiB; about 6 GiB free in the temp folder): sync vs a raw
## read, KServe-style boto3 and rclone copy, one run.
bench-sync-real: bootstrap
	$(PY) bench/sync/run.py --real --repeat 3

bench-control-plane: bootstrap
	$(PY) bench/control_plane/run.py

bench-manifest: bootstrap
	$(PY) bench/manifest/run.py

## One model of three changes, on the local cluster's real node: in place vs new pods (seconds from
## the apply until every pod answers the new version, bytes read from the store, failed requests).
bench-inplace: bootstrap
	$(PY) bench/real_pods/inplace.py --runs 3

## `kubectl triton tune --latency-bound-ms 100 --apply` on the local cluster's real node: the Service
## measured with perf_analyzer before tuning and after the applied config serves, and the sweep's table.
bench-tune: bootstrap
	$(PY) bench/tune/run.py

## Time to serve the full-size generated repository (2 GiB + 500 MiB + small ones) on the local
## cluster's real node with the node cache: new service, scale-up, restart, new revision (new pods
## and in place); phases, bytes from the store, the two targets. About 15 GiB free on / while it runs.
bench-real-size: bootstrap
	$(PY) bench/real_pods/realsize.py
