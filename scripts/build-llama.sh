#!/usr/bin/env bash
# Builds the pinned llama.cpp into OUT (default build/llama): static
# libraries in lib/ and their headers in include/; with LLAMA_BENCH=1 also
# upstream's llama-bench in bin/ (it needs llama.cpp's large common
# library; the libraries do not).
#
# The source is the one PyPI's llama-cpp-python 0.3.36 vendors (upstream
# llama.cpp 0c1e57098, 2026-10-01; ggml 0.25.3), fetched as its source
# package and checked against a SHA-256. GGML_NATIVE=OFF builds for
# x86-64-v3 (AVX2, FMA, F16C, BMI2) instead of this machine's CPU.
#
# llamafile's matrix kernels (tinyBLAS) are on for x86 (LLAMAFILE=OFF
# turns them off), with their guard against small passes rewritten
# (SGEMM_GUARD=exact, the default; upstream keeps upstream's guard, as make
# llama-upstream does): upstream hands one-row passes to ggml's own dot
# products, which sum attention's F16 products in another order than
# tinyBLAS, so a row's result depended on how many rows shared its pass,
# and the engine's exactness (cached = uncached, batched = alone) needs it
# not to. So attention's products take tinyBLAS at every pass size. For
# Q8_0 weights the two kernels are the same arithmetic, so weights keep
# ggml's dot product for passes of up to 3 rows, where it is the faster
# here, and take tinyBLAS from 4 (docs/DESIGN-NOTES.md).
#
# In that exact mode our own kernels take the weights
# (scripts/llama-kernels.patch; Q8_ROWS=off leaves them out, and the
# guard at 4). Q8_0 weights: passes of 2 to 8 rows (one row per
# retrieved passage, or a speculative verification) take a fused AVX2
# kernel, and tinyBLAS from 9 rows; each weight block is loaded, made
# absolute and its scale widened once for all the rows, while each row's
# arithmetic stays that of ggml's one-row dot product, so every row is
# bit for bit what it is in a pass of its own. Q4_1 weights (the default
# model's): every pass takes our kernel, 8 rows a sweep, so a row's
# arithmetic is the kernel's whatever its pass. With AVX-512 VNNI a
# Q8_0 pass can also take two rows a 512-bit register, with the same
# exact sums; which is the faster depends on the CPU, so a process times
# both over its first passes and keeps the faster (DRAGON_Q8_KERNEL=rows
# or pairs fixes the choice).
#
# Also in that exact mode, scripts/llama-attn.patch (ATTN=off leaves it
# out) pads the KV cells a pass attends over to 32 rather than 256 and
# gives tinyBLAS's one-column F16 product (one row's attention) 8-row
# tiles: both exact, both less time for one row per sequence.
#
# ARCH=arm64 cross-builds for linux/arm64 (make device-arm64, into
# build/llama-arm64) with Debian's aarch64-linux-gnu compilers: NEON and
# the dot-product instructions (-march=armv8.2-a+dotprod), nothing newer,
# so it runs on any ARMv8.2 core with dotprod (Cortex-A55/A75 and later,
# i.e. phones since about 2018, a Raspberry Pi 5, a Jetson Orin, Graviton
# 2+). No +fp16 there keeps its arithmetic close to the x86 build's (with
# it ggml's f16 vector code accumulates in f16, where x86 converts to
# f32).
#
# ggml's weight repacking hands passes of 4 rows and more to a GEMM over
# repacked weights whose sums are not its one-row GEMV's, and the
# decoder's batched = alone invariant (docs/DESIGN-NOTES.md) needs a row's
# logits not to depend on its pass (ARM repacks Q8_0: 12 rows in one pass
# differed from the same rows one by one by up to 0.99 in a logit under
# qemu; x86 repacks Qwen's Q4_K: up to 0.48 from 4 rows on, enough to flip
# greedy answers). So repacking is off on ARM, and x86's exact build keeps
# it but sends every row of a pass through the one-row GEMV (each row
# quantized alone, as a one-row pass does): the repacked GEMV is what
# makes upstream's Qwen passes fast (a 1.5B pass of 16 rows took 1.9x
# upstream's time with repacking off), and scripts/llama-repack.patch then
# gives passes of 2 rows and more a kernel that keeps each row's GEMV
# arithmetic while sharing the weights' unpacking. ggml's tiled K-quant matmul
# (below) is off too, for the same reason.
#
# A no-op when OUT/BUILD records this very source and these flags.
set -euo pipefail
out=${1:-build/llama}
arch=${ARCH:-amd64}
pkg=llama-cpp-python
ver=0.3.36
sha=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
jobs=$(nproc)
# OpenMP off: ggml's own thread pool, so a one-thread context starts no
# other threads.
flags=(
  -DCMAKE_BUILD_TYPE=Release
  -DBUILD_SHARED_LIBS=OFF
  -DGGML_NATIVE="${GGML_NATIVE:-ON}"
  -DGGML_OPENMP=OFF
  -DGGML_LLAMAFILE="${LLAMAFILE:-ON}"
  -DLLAMA_CURL=OFF
  -DLLAMA_BUILD_TESTS=OFF
  -DLLAMA_BUILD_EXAMPLES=OFF
  -DLLAMA_BUILD_SERVER=OFF
  -DLLAMA_BUILD_TOOLS=ON
)
cxx=c++
case $arch in
amd64)
  # AMX off: where -march=native finds it (Sapphire Rapids and later),
  # ggml repacks Q8_0 weights for its AMX kernels, whose tile loads died
  # with SIGILL on our decode thread on such a VM, and whose sums are not
  # ggml's dot product's, which batched = alone needs.
  if [ "${GGML_NATIVE:-ON}" = ON ]; then
    noamx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    flags+=(-DCMAKE_C_FLAGS="$noamx" -DCMAKE_CXX_FLAGS="$noamx")
  fi
  ;;
arm64)
  # Cross-compiling: GGML_NATIVE would probe this x86 host, so it is off
  # and the ARM target is named instead.
  cxx=aarch64-linux-gnu-g++
  flags=(
    "${flags[@]/-DGGML_NATIVE=*/-DGGML_NATIVE=OFF}"
    -DCMAKE_SYSTEM_NAME=Linux
    -DCMAKE_SYSTEM_PROCESSOR=aarch64
    -DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc
    -DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++
    -DGGML_CPU_ARM_ARCH=armv8.2-a+dotprod
    -DGGML_CPU_REPACK=OFF
  )
  # ARM's tinyBLAS refuses passes of under 4 or 8 rows by type, so
  # llamafile on would split passes there as upstream's x86 split does.
  flags=("${flags[@]/-DGGML_LLAMAFILE=*/-DGGML_LLAMAFILE=OFF}")
  ;;
*)
  echo "error: ARCH=$arch: amd64 or arm64" >&2
  exit 1
  ;;
esac
guard=upstream
q8rows=off
attn=off
if [ "$arch" = amd64 ] && [ "${LLAMAFILE:-ON}" = ON ] && [ "${SGEMM_GUARD:-exact}" = exact ]; then
  guard_rows=4
  case ${Q8_ROWS:-fused} in
  fused)
    q8rows=fused-2-8
    guard_rows=9
    ;;
  off) ;;
  *)
    echo "error: Q8_ROWS=$Q8_ROWS: fused or off" >&2
    exit 1
    ;;
  esac
  guard=weights-under-$guard_rows-rows
  case ${ATTN:-on} in
  on) attn=pad32-rm8 ;;
  off) ;;
  *)
    echo "error: ATTN=$ATTN: on or off" >&2
    exit 1
    ;;
  esac
fi
here=$(cd "$(dirname "$0")" && pwd)
q8patch=$here/llama-kernels.patch
attnpatch=$here/llama-attn.patch
repackpatch=$here/llama-repack.patch
want="$pkg==$ver sha256:$sha ${flags[*]} sgemm-guard=$guard"
if [ "$guard" != upstream ]; then
  want+=" tiled-mm=opt-in repack=gemv-rows:$(sha256sum <"$repackpatch" | cut -c1-16)"
fi
if [ "$q8rows" != off ]; then
  # The patch's own hash too, so an edited kernel rebuilds.
  want+=" q8-rows=$q8rows:$(sha256sum <"$q8patch" | cut -c1-16)"
fi
if [ "$attn" != off ]; then
  want+=" attn=$attn:$(sha256sum <"$attnpatch" | cut -c1-16)"
fi
if [ "$arch" = amd64 ] && [ "${GGML_NATIVE:-ON}" = ON ]; then
  # A native build is for this CPU: record which, so a build directory
  # carried to another machine is rebuilt, and the engine's build id (the
  # record's hash, which KV caches key on) tells the two apart.
  want+=" cpu=$({ c++ -march=native -Q --help=target 2>/dev/null || true; } | awk '$1 == "-march=" {m = $2} END {print m}')"
fi
targets=(llama)
if [ "${LLAMA_BENCH:-0}" = 1 ]; then
  targets+=(llama-bench)
fi
if [ -f "$out/BUILD" ] && [ "$(cat "$out/BUILD")" = "$want" ] && { [ "${LLAMA_BENCH:-0}" != 1 ] || [ -x "$out/bin/llama-bench" ]; }; then
  exit 0
fi
tools=(cmake "$cxx" python3)
if [ "$guard" != upstream ] || [ "$q8rows" != off ] || [ "$attn" != off ]; then
  tools+=(patch)
fi
for tool in "${tools[@]}"; do
  command -v "$tool" >/dev/null || { echo "error: $tool is needed to build llama.cpp (make deps installs it)" >&2; exit 1; }
done

src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
echo "fetching $pkg==$ver (source package) from PyPI..." >&2
# Only this package as source: with --no-binary :all: pip built the
# source package's build dependencies from source too, to read its
# metadata (5 minutes on 2 cores, against seconds from their wheels).
python3 -m pip download --quiet --no-deps --no-binary "$pkg" --disable-pip-version-check -d "$src" "$pkg==$ver"
tarball="$src/llama_cpp_python-$ver.tar.gz"
if ! echo "$sha  $tarball" | sha256sum -c --status; then
  echo "error: $pkg $ver from PyPI does not match SHA-256 $sha" >&2
  exit 1
fi
tar -xzf "$tarball" -C "$src" "llama_cpp_python-$ver/vendor/llama.cpp"
lsrc="$src/llama_cpp_python-$ver/vendor/llama.cpp"
# replace_line FILE WHAT OLD NEW: OLD must be exactly one whole line of
# FILE (WHAT names it in errors); it becomes NEW.
replace_line() {
  if [ "$(grep -cxF -e "$3" "$1")" != 1 ]; then
    echo "error: $1: $2 is not where this script expects it" >&2
    exit 1
  fi
  awk -v old="$3" -v new="$4" '$0 == old { print new; next } { print }' "$1" >"$1.new" && mv "$1.new" "$1"
  grep -qxF -e "$4" "$1" || { echo "error: $1: $2 was not changed" >&2; exit 1; }
}
if [ "$guard" != upstream ]; then
  # ggml's tiled K-quant matmul takes passes of 8 rows and more (Qwen's
  # Q4_K and Q6_K weights) with other sums than its one-row dot product,
  # breaking batched = alone as repacking does: in the exact build it runs
  # only where GGML_CPU_TILED_MM=1 asks for it.
  replace_line "$lsrc/ggml/src/ggml-cpu/tiled/tiled.cpp" "the tiled matmul's switch" \
    '        enabled = env == NULL || atoi(env) != 0;' '        enabled = env != NULL && atoi(env) != 0;'
  # tinyBLAS's guard against one-row passes becomes one against passes
  # of under 4 (9 with the fused kernel) rows of weights: attention's F16
  # products then take tinyBLAS at every pass size.
  replace_line "$lsrc/ggml/src/ggml-cpu/llamafile/sgemm.cpp" "the one-row guard" \
    '    if (n < 2)' "    if (n < $guard_rows && Atype != GGML_TYPE_F16)"
  # Repacked weights: every row of a pass is quantized alone and takes the
  # one-row GEMV, never the 4-row GEMM (see the top of this script).
  repack=$lsrc/ggml/src/ggml-cpu/repack.cpp
  replace_line "$repack" "the 4-row quantization" \
    '            for (int64_t i11 = ith * 4; i11 < ne11 - ne11 % 4; i11 += nth * 4) {' \
    '            for (int64_t i11 = ith * 4; i11 < 0; i11 += nth * 4) {'
  replace_line "$repack" "the rows quantized alone" \
    '            const int64_t i11_processed = ne11 - ne11 % 4;' '            const int64_t i11_processed = 0;'
  replace_line "$repack" "the GEMM's switch" \
    '        if (nrows > 3) {' '        if (false) {'
  replace_line "$repack" "the GEMV's rows" \
    '        for (int iter = nrows - (nrows % 4); iter < nrows; iter++) {' '        for (int iter = 0; iter < nrows; iter++) {'
fi
# Our patches; patch refuses a source whose lines differ from a patch's
# context at all.
apply_patch() {
  patch -d "$lsrc" -p1 --fuzz=0 --forward --batch --no-backup-if-mismatch --quiet <"$1" ||
    { echo "error: $1 does not apply to this source" >&2; exit 1; }
}
if [ "$guard" != upstream ]; then
  # Our rows kernel for repacked Q4_K weights (after the edits above).
  apply_patch "$repackpatch"
fi
if [ "$q8rows" != off ]; then
  # Our kernels for Q8_0 and Q4_1 weights.
  apply_patch "$q8patch"
  grep -q '^#define DRAGON_Q8_ROWS 1$' "$lsrc/ggml/src/ggml-cpu/ggml-cpu.c" || { echo "error: the Q8_0 rows kernel was not added" >&2; exit 1; }
fi
if [ "$attn" != off ]; then
  apply_patch "$attnpatch"
fi

echo "building llama.cpp ($jobs jobs; a few minutes)..." >&2
cmake -S "$lsrc" -B "$src/build" "${flags[@]}" >"$src/cmake.log" 2>&1 || { cat "$src/cmake.log" >&2; exit 1; }
cmake --build "$src/build" -j "$jobs" --target "${targets[@]}" >>"$src/cmake.log" 2>&1 || { tail -50 "$src/cmake.log" >&2; exit 1; }

rm -rf "$out"
mkdir -p "$out/lib" "$out/include"
find "$src/build" -name '*.a' \( -name 'libllama.a' -o -name 'libggml*.a' \) -exec install -m 644 {} "$out/lib/" \;
install -m 644 "$lsrc/include/llama.h" "$lsrc"/ggml/include/*.h "$out/include/"
if [ "${LLAMA_BENCH:-0}" = 1 ]; then
  install -D -m 755 "$src/build/bin/llama-bench" "$out/bin/llama-bench"
fi
for lib in libllama.a libggml.a libggml-base.a libggml-cpu.a; do
  [ -f "$out/lib/$lib" ] || { echo "error: the build made no $lib" >&2; exit 1; }
done
echo "$want" >"$out/BUILD"
echo "llama.cpp built into $out" >&2
