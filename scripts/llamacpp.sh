#!/usr/bin/env bash
# Build llama.cpp's llama-server, llama-bench and llama-cli (CPU only, -march=native) from the
# llama.cpp source vendored in the llama-cpp-python sdist, cached per CPU.
#   scripts/llamacpp.sh         build if needed; last stdout line is the bin directory
#   scripts/llamacpp.sh path    print the bin directory if already built (exit 1 otherwise)
# Env: LLAMA_CPP_PYTHON_VERSION (default 0.3.36), VSKIP_CACHE, XDG_CACHE_HOME,
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
BIN="$ROOT/$VERSION-$(cpu_key)/bin"

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
WORK="$ROOT/build/$VERSION-$(cpu_key)"
SRC="$WORK/src/llama_cpp_python-$VERSION"
mkdir -p "$WORK/src"
[ -d "$SRC/vendor/llama.cpp" ] || tar -xzf "$SDIST" -C "$WORK/src"
LLAMA="$SRC/vendor/llama.cpp"
# Vendored commit: the sdist ships a shallow git submodule (HEAD right, commit count not), else the changelog.
COMMIT="$({ [ -e "$LLAMA/.git" ] && git -C "$LLAMA" rev-parse --short=9 HEAD 2>/dev/null; } ||
  sed -n "/^## \[$VERSION\]/,/^## \[/p" "$SRC/CHANGELOG.md" | grep -om1 'llama\.cpp@[0-9a-f]*' | cut -d@ -f2 || true)"
echo "llamacpp: llama-cpp-python $VERSION vendors llama.cpp ${COMMIT:-unknown}" >&2

# 3. Configure: Release, native CPU, static binaries, no GPU backends, no curl/openssl, no web UI download.
CMAKE_OPTS=(
  -DCMAKE_BUILD_TYPE=Release
  -DGGML_NATIVE=ON
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
