#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` from the llama.cpp tree vendored in the llama-cpp-python
# source distribution (pinned version + sha256), once, into a cache outside the clone.
# Prints the binary's path on stdout.
#
#   LLAMA_SERVER_CACHE   where builds are kept (default ~/.cache/rollout-proxy/llama-server)
set -euo pipefail

version=0.3.36
sdist_sha=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
cache="${LLAMA_SERVER_CACHE:-$HOME/.cache/rollout-proxy/llama-server}/$version"
binary="$cache/bin/llama-server"

if [ -x "$binary" ]; then
  echo "$binary"
  exit 0
fi

if ! command -v cmake >/dev/null; then
  echo "installing cmake" >&2
  apt-get update -qq >&2 && apt-get install -y -qq cmake >&2
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "fetching llama-cpp-python==$version (source distribution)" >&2
pip download --quiet --no-deps --no-binary llama-cpp-python "llama-cpp-python==$version" -d "$work" >&2
sdist="$work/llama_cpp_python-$version.tar.gz"
got=$(sha256sum "$sdist" | cut -d' ' -f1)
if [ "$got" != "$sdist_sha" ]; then
  echo "sha256 mismatch for $sdist: got $got, want $sdist_sha" >&2
  exit 1
fi
tar xzf "$sdist" -C "$work" "llama_cpp_python-$version/vendor/llama.cpp"
src="$work/llama_cpp_python-$version/vendor/llama.cpp"

# Portable CPU build: GGML_NATIVE=OFF keeps the sampled tokens the same on every machine of
# this kind (AVX2 and AVX-512 builds differ).
echo "building llama-server (several minutes on 2 cores)" >&2
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
  -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF >&2
cmake --build "$work/build" --target llama-server -j "$(nproc)" >&2
mkdir -p "$cache/bin"
cp "$work/build/bin/llama-server" "$binary.tmp"
mv "$binary.tmp" "$binary"
echo "$binary"
