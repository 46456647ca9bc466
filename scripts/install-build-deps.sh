#!/usr/bin/env bash
# Installs what building the C and C++ parts needs (llama.cpp for the in-process engine's
# llama-cpp-sys-2 crate and the pinned llama-server, jemalloc for tikv-jemalloc-sys): cmake,
# make, a C++ compiler, libclang for bindgen, and ccache. Debian packages; does nothing when
# they are already there.
set -euo pipefail
missing=()
command -v cmake >/dev/null || missing+=(cmake)
command -v make >/dev/null || missing+=(make)
command -v c++ >/dev/null || missing+=(g++)
# Not needed, but llama.cpp is then compiled once for every build and clone (.cargo/config.toml).
command -v ccache >/dev/null || missing+=(ccache)
if ! ls /usr/lib/llvm-*/lib/libclang.so* /usr/lib/x86_64-linux-gnu/libclang*.so* 2>/dev/null | grep -q 'libclang\(-[0-9.]*\)\?\.so'; then
  missing+=(libclang-dev)
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing build dependencies: ${missing[*]}" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq >&2
  $sudo apt-get install -y -qq "${missing[@]}" >&2
fi
