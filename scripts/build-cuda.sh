#!/usr/bin/env bash
# Copied from ../shared/scripts/build-cuda.sh (the workplace's shared build script) so that CI,
# which runs on a fresh clone without ../shared, can build the `cuda` feature. Changes: the
# vendored CUTLASS headers are looked for in several places (step 4), and the build's target
# directory can be chosen with CARGO_TARGET_DIR as usual. Keep the two in step.
#
# Build a Rust crate that uses candle 0.11.x with the `cuda` feature, for an sm_90
# GPU (H100/H200), on an x86_64 Linux box that has no GPU and no CUDA toolkit.
# nvcc, headers and link-time libraries come from NVIDIA's PyPI wheels (CUDA 13.0).
# Run from the crate root. Needs: python3 + pip, gcc/g++, cargo. No root.
set -euo pipefail

CUDA_DIR="${CUDA_DIR:-$HOME/.cache/candle-cuda-13.0}"   # where the wheels get unpacked
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"        # 90 => nvcc targets sm_90a (H100/H200 only)
C="$CUDA_DIR/nvidia/cu13"

# 1. CUDA 13.0 toolchain from PyPI. Pin 13.0: driver 580 JITs PTX ISA <= 9.0, which is what
#    nvcc 13.0 emits; a newer nvcc (13.1+) emits newer PTX that driver 580 refuses.
if [ ! -x "$C/bin/nvcc" ] || [ ! -e "$C/lib/libcublas.so.13" ] || [ ! -e "$C/lib/libcurand.so.10" ]; then
  rm -rf "$CUDA_DIR"
  python3 -m pip install --quiet --no-deps --disable-pip-version-check --target "$CUDA_DIR" \
    nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 \
    nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85 nvidia-cuda-nvrtc==13.0.88 \
    nvidia-cublas==13.0.2.14 nvidia-curand==10.4.0.35
fi

# 2. Linker names the wheels leave out (they ship only lib*.so.N), and a lib64 alias.
for l in cublas cublasLt nvrtc cudart; do ln -sf "lib$l.so.13" "$C/lib/lib$l.so"; done
ln -sf libcurand.so.10 "$C/lib/libcurand.so"
ln -sfn lib "$C/lib64"

# 3. candle-core 0.11 turns on cudarc's `dynamic-linking`, so the link needs -lcuda, and no
#    wheel ships libcuda.so (it is part of the driver). Make a link-only stub with soname
#    libcuda.so.1 exporting every driver entry point cudarc declares; every stub returns
#    CUDA_ERROR_STUB_LIBRARY (34). At run time the real driver's libcuda.so.1 is used.
# --all-features: cudarc is only in the graph when the optional `cuda` feature is counted.
cargo fetch --quiet
CUDARC_DIR=$(cargo metadata --format-version 1 --all-features | python3 -c '
import json, os, sys
m = json.load(sys.stdin)
print(next(os.path.dirname(p["manifest_path"]) for p in m["packages"] if p["name"] == "cudarc"))')
mkdir -p "$C/lib/stubs"
grep -ohE '^pub unsafe fn cu[A-Za-z0-9_]+\(' "$CUDARC_DIR/src/driver/sys/mod.rs" \
  | sed -E 's/^pub unsafe fn ([A-Za-z0-9_]+)\($/int \1(void){return 34;}/' | sort -u > "$C/lib/stubs/cuda_stub.c"
gcc -shared -fPIC -O1 -Wl,-soname,libcuda.so.1 -o "$C/lib/stubs/libcuda.so" "$C/lib/stubs/cuda_stub.c"

# 4. candle-flash-attn (the optional paged FlashAttention kernels) has its build helper clone CUTLASS
#    from GitHub at a pinned commit, which no machine here can reach. Lay out that commit's headers
#    (vendored beside this script, BSD-3-Clause) where the helper looks first: a folder whose
#    `git rev-parse HEAD` names the pinned commit and which holds include/ (it then skips the clone).
FA_DIR=$(cargo metadata --format-version 1 --all-features | python3 -c '
import json, os, sys
m = json.load(sys.stdin)
print(next((os.path.dirname(p["manifest_path"]) for p in m["packages"] if p["name"] == "candle-flash-attn"), ""))')
if [ -n "$FA_DIR" ]; then
  commit=$(grep -oE 'CUTLASS_COMMIT: &str = "[0-9a-f]{40}"' "$FA_DIR/build.rs" | grep -oE '[0-9a-f]{40}')
  # The headers' tarball: $THRONG_CUTLASS_TARBALL, or beside the shared copy of this script
  # (../shared/vendor), or in this repository's vendor/.
  name=cutlass-3.5.0-7d49e6c7-include.tar.gz
  here="$(dirname "$(readlink -f "$0")")"
  vendored=""
  for candidate in "${THRONG_CUTLASS_TARBALL:-}" "$here/../vendor/$name" "$here/../../shared/vendor/$name"; do
    if [ -n "$candidate" ] && [ -f "$candidate" ]; then vendored="$candidate"; break; fi
  done
  dest="${CUDAFORGE_HOME:-$HOME/.cudaforge}/git/checkouts/cutlass-${commit:0:16}"
  if [ "$commit" != 7d49e6c7e2f8896c47f586706e67e1fb215529dc ]; then
    echo "candle-flash-attn pins CUTLASS $commit; the vendored headers are 7d49e6c7: vendor that commit too" >&2; exit 1
  fi
  if [ ! -d "$dest/include" ] && [ -z "$vendored" ]; then
    echo "note: no vendored CUTLASS headers ($name); the flash-attn build will clone them from GitHub" >&2
  elif [ ! -d "$dest/include" ]; then
    mkdir -p "$dest" && tar xzf "$vendored" -C "$dest"
    git -C "$dest" init -q && echo "$commit" > "$dest/.git/HEAD"
  fi
fi

# 5. Build. cudarc reads the CUDA version from `nvcc --version` (=> cuda-13000 bindings) and
#    adds $CUDA_HOME/lib and $CUDA_HOME/lib/stubs to the link search path; cudaforge
#    (candle-kernels' build script) finds nvcc on PATH and reads CUDA_COMPUTE_CAP.
export CUDA_HOME="$C" CUDA_PATH="$C" PATH="$C/bin:$PATH"
# candle-flash-attn's build helper uses half the cores unless told otherwise.
export CUDAFORGE_THREADS="${CUDAFORGE_THREADS:-$(nproc)}"
cargo build --release "$@"

echo "Built. DT_NEEDED CUDA libs (must be found at run time, e.g. via LD_LIBRARY_PATH):"
for f in "${CARGO_TARGET_DIR:-target}"/release/*; do
  [ -f "$f" ] && [ -x "$f" ] && readelf -d "$f" 2>/dev/null | grep -E 'NEEDED.*(cuda|cublas|curand|nvrtc)' | sed "s|^|  $(basename "$f"): |"
done || true
