#!/usr/bin/env bash
# Build Horovod 0.28.1 from its sdist into the given venv, for CPU (gloo) or GPU (NCCL).
#
#   scripts/build_horovod.sh [VENV] [cpu|gpu]      (defaults: .venv cpu)
#
# Why a script: the PyPI build fails with torch >= 2.x CUDA wheels. On a CPU build, Horovod's
# CMake finds a CUDA toolkit (nvcc, or the one torch's CUDA wheel implies) and turns GPU ops
# on; and torch's headers need C++20 while Horovod pins C++14. So we patch the unpacked sdist:
#   - cpu: CUDA detection off (top-level check_language/find_package, FindPytorch's
#          Pytorch_CUDA) so the build is CPU + gloo only;
#   - C++ standard 17 top-level, 20 for the torch extension;
# and build with HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1, MPI only if mpicxx exists,
# --no-build-isolation against the venv's torch. ~6 min on 2 cores. Idempotent: skips if the
# venv already imports horovod.torch built against the same torch.
set -euo pipefail
VENV="${1:-.venv}"
MODE="${2:-cpu}"
PY="$VENV/bin/python"
VERSION=0.28.1

if "$PY" - <<'PYEOF' 2>/dev/null; then
import horovod.torch as hvd, sys
sys.exit(0 if hvd.gloo_built() else 1)
PYEOF
  echo "horovod already built in $VENV"; exit 0
fi

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
  export HOROVOD_GPU_OPERATIONS=NCCL
fi
export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_TENSORFLOW=1 \
       HOROVOD_WITHOUT_MXNET=1 HOROVOD_CMAKE_BUILD_TYPE=Release MAKEFLAGS="-j$(nproc)"
if command -v mpicxx >/dev/null; then export HOROVOD_WITH_MPI=1; else export HOROVOD_WITHOUT_MPI=1; fi
"$PY" -m pip install -q "cloudpickle" "psutil" "pyyaml" "packaging" "cffi>=1.4.0" "setuptools<81" wheel
"$PY" -m pip install -q --no-build-isolation --no-deps "$src"
# no hvd.init() here: inside a container build the hostname may not resolve (gloo needs it)
"$PY" - <<'PYEOF'
import horovod.torch as hvd
assert hvd.gloo_built(), "horovod was built without gloo"
print(f"horovod built: gloo={hvd.gloo_built()} mpi={hvd.mpi_built()} nccl={hvd.nccl_built()}")
PYEOF
