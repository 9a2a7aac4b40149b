#!/usr/bin/env bash
# Regenerates reports/example: the two CPU twins of the seed study, measured on this machine,
# and the report over them. ~15 min on 2 cores. Run from the repository root after `make setup`.
set -euo pipefail
OUT=${1:-reports/example}
BENCH=.venv/bin/bench
rm -rf "$OUT"
# language twin: 3 frameworks x 1,2 ranks x 2 repeats (repeats give the bootstrap intervals)
$BENCH run -m experiment=seed_language_tiny logger=none run.progress=false \
  framework=ddp,fsdp_full,deepspeed_zero2 launcher.nproc=1,2 run.repeat=0,1 run.dir="$OUT/runs/language"
# image twin: 2 frameworks x 1,2 ranks, real images (scikit-learn digits)
$BENCH run -m experiment=seed_image_tiny logger=none run.progress=false \
  framework=ddp,fsdp_full launcher.nproc=1,2 run.dir="$OUT/runs/image"
# keep what a reader needs: results, per-step metrics, resolved configs (not the logs)
find "$OUT/runs" -name logs -type d -prune -exec rm -rf {} +
find "$OUT/runs" -name agent.log -delete
$BENCH report "$OUT/runs" -o "$OUT" --wandb
