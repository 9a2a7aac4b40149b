# The two commands: `make bench` and `make test`. Both set up .venv from nothing.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
# Tested pins. They come from the machine's local wheel store; other torch versions
# download several GB or do not import together with torchvision.
TORCH_PINS := torch==2.14.1 torchvision==0.29.1
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml Makefile scripts/build_horovod.sh | sha1sum | cut -c1-12)
BENCH_DIR ?= outputs/make-bench
# pytest workers (pytest-xdist): the suite waits on processes, Slurm and shaped links much of its
# time; on two cores 3 workers kept them busier than 2 (pytest 1284 s against 1796 s, 2026-11-29,
# docs/setup.md), and 4 no busier than 3 (1579.0 s against 1577.2 s from fresh clones, 2026-11-30);
# tests/conftest.py groups the files that share something machine-wide
TEST_WORKERS ?= 3

.PHONY: bench test lint setup system-deps clean
setup: $(STAMP)

system-deps:   # Chromium for the report test (apt, as root)
	bash scripts/system_deps.sh

$(STAMP):
	@command -v $(PY) >/dev/null || { echo "need $(PY) (Python 3.11)"; exit 2; }
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH_PINS)
	$(BIN)/python -m pip install -q -e '.[dev,deepspeed,fairscale,torchft]' $(TORCH_PINS)
	bash scripts/build_horovod.sh $(VENV) cpu   # ~6 min once; CPU + gloo (see the script)
	# DeepSpeed JIT-builds its CPU Adam op and its shared-memory communication op (every CPU run's
	# init_distributed) on first use (~1.5 min and ~35 s; cached in $(VENV)/torch_extensions: importing
	# ddlbench sets TORCH_EXTENSIONS_DIR there): build them here, once, not inside the first test that starts DeepSpeed
	$(BIN)/python -c "import ddlbench; from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load(); \
	    from deepspeed.accelerator import get_accelerator as a; a().create_op_builder('ShareMemCommBuilder').load()"
	touch $@

# The comparison: gpt2_tiny on 2 ranks (CPU/gloo here, NCCL on GPUs) under every framework family,
# BENCH_REPEATS times each, the repeats interleaved (every framework once, then again: run.repeat
# is the outer sweep key), beside a 1-rank DDP baseline; then the table and the report, whose
# verdict names a winner only beyond the run-to-run noise (ddlbench/metrics/compare.py: 3 runs a
# side is the fewest that can). Each run's warm-up lasts until its steps settle (at most 30 steps:
# ddlbench/metrics/warmup.py), so no window starts on steps still falling. A failed run is shown,
# not hidden: the table and report are still written, and make exits non-zero.
BENCH_FRAMEWORKS ?= ddp,fsdp_full,deepspeed_zero2,deepspeed_zero3,horovod,fairscale_oss,pipeline_1f1b,tensor_parallel
BENCH_REPEATS ?= 3
bench: setup
	rm -rf $(BENCH_DIR)
	$(BIN)/bench run framework=ddp model=gpt2_tiny launcher.nproc=1 run.progress=false run.dir=$(BENCH_DIR)/baseline_ddp_n1
	rc=0; $(BIN)/bench run -m "run.repeat=range(0,$(BENCH_REPEATS))" framework=$(BENCH_FRAMEWORKS) model=gpt2_tiny \
	    launcher.nproc=2 run.warmup_max_steps=30 run.progress=false run.dir=$(BENCH_DIR)/n2 || rc=$$?; \
	$(BIN)/bench table $(BENCH_DIR) && $(BIN)/bench report $(BENCH_DIR) -o $(BENCH_DIR)/report && exit $$rc

test: setup system-deps lint
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS)

lint: setup   # ruff, configured in pyproject.toml ([tool.ruff])
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) outputs
