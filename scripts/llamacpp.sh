#!/usr/bin/env bash
# Build llama.cpp's llama-server, llama-bench and llama-cli (CPU only) from the llama.cpp source
# vendored in the llama-cpp-python sdist, cached per CPU and ISA level.
#   scripts/llamacpp.sh         build if needed; last stdout line is the bin directory
#   scripts/llamacpp.sh path    print the bin directory if already built (exit 1 otherwise)
# Env: LLAMA_CPP_ISA: x86 ISA level to compile for (both commands honour it; unknown value: exit 2):
#        native      -march=native (default; bin dir <cache>/<version>-<cpu key>/bin)
#        avx2        AVX2+FMA+F16C (+SSE4.2) only: no AVX512, AVX-VNNI, AMX or BMI2
#        avxvnni     avx2 + AVX-VNNI
#        avx512vnni  avx2 + AVX512F/CD/VL/DQ/BW + AVX512-VNNI (no VBMI, BF16, AMX)
#        portable    no x86 SIMD options at all (compiler's baseline, SSE2 on x86-64)
#      a non-native level gets bin dir <cache>/<version>-<cpu key>-isa-<level>/bin;
#      LLAMA_CPP_PYTHON_VERSION (default 0.3.36), VSKIP_CACHE, XDG_CACHE_HOME,
#      LLAMA_CPP_BUILD_NUMBER (llama.cpp "bNNNN" number to stamp, default 0; the sdist's git is shallow).
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
ROOT="${VSKIP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vskip}/llama.cpp"
TARGETS=(llama-server llama-bench llama-cli)

# CPU key: model name + sorted flags, so a native build never runs on a CPU lacking its ISA.
cpu_key() {
  {
    grep -m1 -E '^(model name|Processor|CPU part)' /proc/cpuinfo | cut -d: -f2- || true
    grep -m1 -E '^(flags|Features)' /proc/cpuinfo | cut -d: -f2- | tr ' ' '\n' | sed '/^$/d' | sort -u || true
  } | sha256sum | cut -c1-12
}

# ISA level: CPU-backend cmake options (names from this llama.cpp's ggml/CMakeLists.txt). Every x86
# option is set explicitly, since with GGML_NATIVE=OFF the SSE4.2/AVX/AVX2/BMI2/FMA/F16C ones default ON.
ISA="${LLAMA_CPP_ISA:-native}"
X86_OPTS=(GGML_SSE42 GGML_AVX GGML_AVX2 GGML_BMI2 GGML_FMA GGML_F16C GGML_AVX_VNNI GGML_AVX512
  GGML_AVX512_VBMI GGML_AVX512_VNNI GGML_AVX512_BF16 GGML_AMX_TILE GGML_AMX_INT8 GGML_AMX_BF16)
AVX2_ON=(GGML_SSE42 GGML_AVX GGML_AVX2 GGML_FMA GGML_F16C)
case "$ISA" in
  native)     ISA_ON=() ;;
  avx2)       ISA_ON=("${AVX2_ON[@]}") ;;
  avxvnni)    ISA_ON=("${AVX2_ON[@]}" GGML_AVX_VNNI) ;;
  avx512vnni) ISA_ON=("${AVX2_ON[@]}" GGML_AVX512 GGML_AVX512_VNNI) ;;
  portable)   ISA_ON=() ;;
  *) echo "llamacpp: unknown LLAMA_CPP_ISA '$ISA' (native|avx2|avxvnni|avx512vnni|portable)" >&2; exit 2 ;;
esac
ISA_OPTS=(-DGGML_CPU_ALL_VARIANTS=OFF -DGGML_BACKEND_DL=OFF)
if [ "$ISA" = native ]; then
  KEY="$VERSION-$(cpu_key)"
  ISA_OPTS+=(-DGGML_NATIVE=ON)
else
  KEY="$VERSION-$(cpu_key)-isa-$ISA"
  ISA_OPTS+=(-DGGML_NATIVE=OFF)
  for o in "${X86_OPTS[@]}"; do
    if [[ " ${ISA_ON[*]} " == *" $o "* ]]; then ISA_OPTS+=("-D$o=ON"); else ISA_OPTS+=("-D$o=OFF"); fi
  done
fi
BIN="$ROOT/$KEY/bin"

# A bin dir is moved into place only once complete, so any llama-* in it means a finished build.
built() { compgen -G "$BIN/llama-*" >/dev/null; }

case "${1:-build}" in
  path) built && { echo "$BIN"; exit 0; }; exit 1 ;;
  build) ;;
  *) echo "usage: $0 [build|path]" >&2; exit 2 ;;
esac
if built; then echo "$BIN"; exit 0; fi

# 1. Fetch the sdist (kept in the cache so a failed build does not download again).
SDIST_DIR="$ROOT/sdist"
SDIST="$SDIST_DIR/llama_cpp_python-$VERSION.tar.gz"
mkdir -p "$SDIST_DIR"
if [ ! -f "$SDIST" ]; then
  .venv/bin/pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
    "llama-cpp-python==$VERSION" -d "$SDIST_DIR" >&2
fi

# 2. Unpack into a build dir outside the repo (kept on failure so a rerun resumes the compile).
WORK="$ROOT/build/$KEY"
SRC="$WORK/src/llama_cpp_python-$VERSION"
mkdir -p "$WORK/src"
[ -d "$SRC/vendor/llama.cpp" ] || tar -xzf "$SDIST" -C "$WORK/src"
LLAMA="$SRC/vendor/llama.cpp"
# Vendored commit: the sdist ships a shallow git submodule (HEAD right, commit count not), else the changelog.
COMMIT="$({ [ -e "$LLAMA/.git" ] && git -C "$LLAMA" rev-parse --short=9 HEAD 2>/dev/null; } ||
  sed -n "/^## \[$VERSION\]/,/^## \[/p" "$SRC/CHANGELOG.md" | grep -om1 'llama\.cpp@[0-9a-f]*' | cut -d@ -f2 || true)"
echo "llamacpp: llama-cpp-python $VERSION vendors llama.cpp ${COMMIT:-unknown}" >&2

# 3. Configure: Release, native CPU or the chosen ISA level, static binaries, no GPU backends,
#    no curl/openssl, no web UI download.
CMAKE_OPTS=(
  -DCMAKE_BUILD_TYPE=Release
  "${ISA_OPTS[@]}"
  -DLLAMA_CURL=OFF
  -DLLAMA_OPENSSL=OFF
  -DLLAMA_USE_PREBUILT_UI=OFF
  -DLLAMA_BUILD_UI=OFF
  -DBUILD_SHARED_LIBS=OFF
  -DGGML_CUDA=OFF -DGGML_HIP=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF -DGGML_SYCL=OFF -DGGML_OPENCL=OFF
  -DLLAMA_BUILD_TESTS=OFF
  -DLLAMA_BUILD_EXAMPLES=OFF
  -DLLAMA_BUILD_COMMIT="${COMMIT:-unknown}"
  -DLLAMA_BUILD_NUMBER="${LLAMA_CPP_BUILD_NUMBER:-0}"
)
echo "llamacpp: cmake ${CMAKE_OPTS[*]}" >&2
nice -n 10 cmake -S "$LLAMA" -B "$WORK/build" -G "Unix Makefiles" "${CMAKE_OPTS[@]}" >&2

# Keep only the targets this llama.cpp version defines.
HELP="$(cmake --build "$WORK/build" --target help)"
BUILD=()
for t in "${TARGETS[@]}"; do
  if grep -qx "\.\.\. $t" <<<"$HELP"; then BUILD+=("$t"); else echo "llamacpp: no target $t, skipped" >&2; fi
done
[ "${#BUILD[@]}" -gt 0 ] || { echo "llamacpp: none of ${TARGETS[*]} exist" >&2; exit 1; }

# 4. Compile at low priority (the machine may be busy benchmarking).
start=$SECONDS
nice -n 10 cmake --build "$WORK/build" --config Release -j"$(nproc)" --target "${BUILD[@]}" >&2
echo "llamacpp: built ${BUILD[*]} in $((SECONDS - start)) s" >&2

# 5. Install atomically: fill a temp dir, then move it into place; drop the build tree.
mkdir -p "$(dirname "$BIN")"
TMP="$(mktemp -d "$BIN.tmp.XXXXXX")"
for t in "${BUILD[@]}"; do install -m 755 "$WORK/build/bin/$t" "$TMP/"; done
chmod 755 "$TMP"
rm -rf "$BIN" && mv "$TMP" "$BIN"
rm -rf "$WORK" && rmdir "$ROOT/build" 2>/dev/null || true
echo "$BIN"
