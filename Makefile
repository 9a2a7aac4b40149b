# The two commands: `make bench` and `make test`. Both set up .venv from nothing.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
# Tested pins. They come from the machine's local wheel store; other torch versions
# download several GB or do not import together with torchvision.
TORCH_PINS := torch==2.14.1 torchvision==0.29.1
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml Makefile scripts/build_horovod.sh | sha1sum | cut -c1-12)
BENCH_DIR ?= outputs/make-bench

.PHONY: bench test setup system-deps clean
setup: $(STAMP)

system-deps:   # Chromium for the report test (apt, as root)
	bash scripts/system_deps.sh

$(STAMP):
	@command -v $(PY) >/dev/null || { echo "need $(PY) (Python 3.11)"; exit 2; }
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH_PINS)
	$(BIN)/python -m pip install -q -e '.[dev,deepspeed,fairscale]' $(TORCH_PINS)
	bash scripts/build_horovod.sh $(VENV) cpu   # ~6 min once; CPU + gloo (see the script)
	touch $@

# Default comparison: DDP on gpt2_tiny at 1 and 2 ranks (CPU/gloo here, NCCL on GPUs).
bench: setup
	rm -rf $(BENCH_DIR)
	$(BIN)/bench run framework=ddp model=gpt2_tiny launcher.nproc=1 run.dir=$(BENCH_DIR)/ddp_n1
	$(BIN)/bench run framework=ddp model=gpt2_tiny launcher.nproc=2 run.dir=$(BENCH_DIR)/ddp_n2
	$(BIN)/bench table $(BENCH_DIR)
	$(BIN)/bench report $(BENCH_DIR) -o $(BENCH_DIR)/report

test: setup system-deps
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) outputs
