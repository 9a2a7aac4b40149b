#!/usr/bin/env bash
# One call on the lent GPU machine (no network; torch 2.11, Python 3.12): install what
# scripts/device_wheels.sh put in .whl/, print the software seen, run benchmarks/gpu_matrix.py
# with the arguments given; as each cell ends its record is appended to $OUT/NAME.records.jsonl
# and the rows to $OUT/NAME.checks.json (--keep), so a call stopped at its limit returns what it
# finished; at the end the whole output (traces, reports) is packed into $OUT/NAME.tar.gz (the
# tool brings back at most 8 files, 2 folders down).
#   run(carry=[".whl"], command="bash scripts/device_gpu_matrix.sh NAME --models gpt2_small ...")
set -uo pipefail
name=$1; shift
export PYTHONUNBUFFERED=1
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  >/tmp/pip.log 2>&1 || { tail -20 /tmp/pip.log; exit 3; }
export PYTHONPATH=$PWD:/tmp/site
if [ ! -d /tmp/site/deepspeed ]; then
  DS_BUILD_OPS=0 python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site \
    .whl/deepspeed-*.tar.gz .whl/fairscale-*.tar.gz .whl/antlr4-*.tar.gz >>/tmp/pip.log 2>&1 \
    || { tail -30 /tmp/pip.log; exit 3; }
fi
echo "install: $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv
python3 -c "import sys, torch, torchvision, transformers, deepspeed, fairscale, hydra, pydantic; \
print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version(), \
'tv', torchvision.__version__, 'tf', transformers.__version__, 'ds', deepspeed.__version__, 'fs', fairscale.__version__)"
mkdir -p /tmp/gm
python3 benchmarks/gpu_matrix.py --out "/tmp/gm/$name" --keep "$OUT/$name" "$@" 2>&1 | tee "$OUT/$name.log"
rc=${PIPESTATUS[0]}
tar -C /tmp/gm -czf "$OUT/$name.tar.gz" --exclude='*.pt' --exclude='*.ckpt' "$name"
ls -la "$OUT"
echo "gpu_matrix rc=$rc, call $(( $(date +%s) - t0 )) s"
exit $rc
