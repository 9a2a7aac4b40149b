#!/usr/bin/env bash
# Build Horovod 0.28.1 from its sdist into the given venv, for CPU (gloo) or GPU (NCCL + gloo).
#
#   scripts/build_horovod.sh [VENV] [cpu|gpu]      (defaults: .venv cpu)
#
# Why a script: the PyPI build fails with torch >= 2.x CUDA wheels. On a CPU build, Horovod's
# CMake finds a CUDA toolkit (nvcc, or the one torch's CUDA wheel implies) and turns GPU ops
# on; and torch's headers need C++20 while Horovod pins C++14. So we patch the unpacked sdist:
#   - cpu: CUDA detection off (top-level check_language/find_package, FindPytorch's
#          Pytorch_CUDA) so the build is CPU + gloo only;
#   - gpu: NCCL ops against the NCCL torch itself loads (the nvidia-nccl wheel, linked shared:
#          one NCCL in the process, not apt's static copy beside torch's), the CUDA runtime
#          linked shared (torch's libcudart), kernels in C++17 (CUDA 13's CCCL needs it) for
#          TORCH_CUDA_ARCH_LIST only. nvcc: $CUDA_HOME/bin/nvcc, else /usr/local/cuda's, else the
#          nvidia-cuda-nvcc wheels of torch's CUDA version (no CUDA base image needed);
#   - C++ standard 17 top-level, 20 for the torch extension;
# and build with HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1, MPI only if mpicxx exists,
# --no-build-isolation against the venv's torch. ~6 min on 2 cores. Idempotent: skips if the
# venv already imports a horovod.torch of the asked kind (gpu: NCCL built in, so a CPU build
# left in the venv is rebuilt, not kept).
set -euo pipefail
VENV="${1:-.venv}"
MODE="${2:-cpu}"
PY="$VENV/bin/python"
VERSION=0.28.1

if "$PY" - "$MODE" <<'PYEOF' 2>/dev/null; then
import horovod.torch as hvd, sys
sys.exit(0 if hvd.gloo_built() and (sys.argv[1] != "gpu" or hvd.nccl_built()) else 1)
PYEOF
  echo "horovod ($MODE) already built in $VENV"; exit 0
fi

# CUDA toolkit for the GPU build: $CUDA_HOME, /usr/local/cuda, or torch's CUDA version as wheels
# (nvcc on PATH is not used: it may be a wrapper script, which says nothing of the toolkit's root).
cuda_toolkit() {
  local dir="$1" home="${CUDA_HOME:-}"
  if [ -z "$home" ] && [ -x /usr/local/cuda/bin/nvcc ]; then home=/usr/local/cuda; fi
  if [ -z "$home" ]; then
    local cuda major
    cuda="$("$PY" -c 'import torch; print(torch.version.cuda or "")')"
    [ -n "$cuda" ] || { echo "gpu build: the venv's torch has no CUDA (torch.version.cuda is None)" >&2; exit 1; }
    major="${cuda%%.*}"
    "$PY" -m pip install -q --target "$dir" "nvidia-cuda-nvcc==$cuda.*" "nvidia-cuda-crt==$cuda.*" \
      "nvidia-nvvm==$cuda.*" "nvidia-cuda-cccl==$cuda.*" "nvidia-cuda-runtime==$cuda.*" 2>&1 | grep -v "is ignored" || true
    home="$dir/nvidia/cu$major"
    # nvcc.profile looks for lib64/; the wheels ship lib/ with versioned names only
    ln -sfn lib "$home/lib64"
    ln -sf "libcudart.so.$major" "$home/lib/libcudart.so"
  fi
  [ -x "$home/bin/nvcc" ] || { echo "gpu build: no nvcc in $home/bin" >&2; exit 1; }
  export HOROVOD_CUDA_HOME="$home" CUDA_HOME="$home" CUDAToolkit_ROOT="$home" PATH="$home/bin:$PATH"
  echo "gpu build: $("$home/bin/nvcc" --version | tail -1)"
}

# NCCL: the one torch loads (nvidia-nccl wheel), exposed as include/ + lib/libnccl.so for CMake.
nccl_home() {
  local dir="$1" wheel
  wheel="$("$PY" -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) if nvidia.nccl.__file__ else list(nvidia.nccl.__path__)[0])')"
  mkdir -p "$dir/lib"
  ln -sfn "$wheel/include" "$dir/include"
  ln -sf "$wheel/lib/libnccl.so.2" "$dir/lib/libnccl.so"
  export HOROVOD_NCCL_HOME="$dir"
}

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$PY" -m pip download -q --no-deps --no-binary :all: "horovod==$VERSION" -d "$work" 2>&1 | grep -v "is ignored" || true
tar -xzf "$work/horovod-$VERSION.tar.gz" -C "$work"
src="$work/horovod-$VERSION"

sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$src/CMakeLists.txt"
sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 20)/' "$src/horovod/torch/CMakeLists.txt"
if [ "$MODE" = cpu ]; then
  sed -i 's/^check_language(CUDA)$/# CPU build: CUDA detection disabled by scripts\/build_horovod.sh/' "$src/CMakeLists.txt"
  sed -i 's/^    find_package(CUDAToolkit)$/    # find_package(CUDAToolkit) disabled for a CPU build/' "$src/CMakeLists.txt"
  sed -i 's/print(True if ((torch.version.cuda is not None) and (CUDA_HOME is not None)) else False)/print(False)/' \
    "$src/cmake/Modules/FindPytorch.cmake"
  export HOROVOD_WITHOUT_GPU_OPERATIONS=1
else
  cuda_toolkit "$work/cuda"
  nccl_home "$work/nccl"
  sed -i 's/set(CMAKE_CUDA_RUNTIME_LIBRARY "Static")/set(CMAKE_CUDA_RUNTIME_LIBRARY "Shared")/' "$src/CMakeLists.txt"
  sed -i 's/set(CMAKE_CUDA_STANDARD 11)/set(CMAKE_CUDA_STANDARD 17)/' "$src/horovod/common/ops/cuda/CMakeLists.txt"
  arch="${TORCH_CUDA_ARCH_LIST:-8.0;8.6;8.9;9.0;10.0;12.0}"
  export HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_LINK=SHARED \
         HOROVOD_BUILD_CUDA_CC_LIST="$(echo "$arch" | tr -d '.' | tr ';' ',' | sed 's/+PTX//g')"
fi
export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_TENSORFLOW=1 \
       HOROVOD_WITHOUT_MXNET=1 HOROVOD_CMAKE_BUILD_TYPE=Release MAKEFLAGS="-j$(nproc)"
if command -v mpicxx >/dev/null; then export HOROVOD_WITH_MPI=1; else export HOROVOD_WITHOUT_MPI=1; fi
"$PY" -m pip install -q "cloudpickle" "psutil" "pyyaml" "packaging" "cffi>=1.4.0" "setuptools<81" wheel
"$PY" -m pip install -q --no-build-isolation --no-deps "$src"
# no hvd.init() here: inside a container build the hostname may not resolve (gloo needs it)
"$PY" - "$MODE" <<'PYEOF'
import horovod.torch as hvd
import sys
assert hvd.gloo_built(), "horovod was built without gloo"
assert sys.argv[1] != "gpu" or hvd.nccl_built(), "gpu build: horovod was built without NCCL"
print(f"horovod built: gloo={hvd.gloo_built()} mpi={hvd.mpi_built()} nccl={hvd.nccl_built()}")
PYEOF
