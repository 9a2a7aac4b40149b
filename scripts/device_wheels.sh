#!/usr/bin/env bash
# Fill .whl/ with what the lent GPU machine lacks to run ddlbench (its image has torch 2.11,
# Python 3.12, transformers, pandas, matplotlib, nvidia-ml-py, nvcc, cmake; no network): hydra,
# omegaconf, pydantic, orjson, DeepSpeed/FairScale/Horovod sources and their small needs
# (antlr4 4.9.3, which omegaconf pins, exists only as a source archive).
# DeepSpeed and FairScale install there with --no-build-isolation against its torch; Horovod is
# built there by scripts/build_horovod.sh (its nvcc, NCCL from torch's wheel).
#
#   bash scripts/device_wheels.sh            # here, with package registries reachable
# then, in the device call (carry .whl):
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#   python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site .whl/*.tar.gz
#   export PYTHONPATH=$PWD:/tmp/site
#   PIP_NO_INDEX=1 PIP_FIND_LINKS=$PWD/.whl bash scripts/build_horovod.sh /opt/torch/.venv gpu
set -euo pipefail
cd "$(dirname "$0")/.."
out=.whl
mkdir -p "$out"
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
      --platform manylinux1_x86_64 --platform any)
py() { python3 -m pip download -q --no-deps "${plat[@]}" -d "$out" "$@" 2>&1 | grep -v "is ignored" || true; }
py hydra-core==1.3.8 omegaconf==2.3.1 \
   annotated-types typing-inspection orjson==3.13.0 hjson==3.1.0 hydra-submitit-launcher submitit \
   cffi pycparser 'setuptools<81' \
   torchao==0.18.0                    # Horovod's build needs (scripts/build_horovod.sh); run.float8
# pydantic and pydantic-core as a pair, the versions in this project's venv: pydantic pins its core
# exactly, and a pair that differs stops every import (seen on the H200, 2026-11-26)
py $(.venv/bin/python -c 'import pydantic, pydantic_core; print(f"pydantic=={pydantic.VERSION} pydantic-core=={pydantic_core.__version__}")')
python3 -m pip download -q --no-deps --no-binary :all: -d "$out" deepspeed==0.19.8 fairscale==0.4.13 horovod==0.28.1 \
  antlr4-python3-runtime==4.9.3 \
  2>&1 | grep -v "is ignored" || true
ls -la "$out"
du -sh "$out"
