#!/usr/bin/env bash
# Copies the header-only dependencies a GPU machine without these packages
# lacks (Eigen, spdlog, fmt, CLI11, nlohmann-json) into .deps/include (ignored
# by git), to be copied there with the working tree. CMake falls back to it when
# find_package fails.
set -euo pipefail
cd "$(dirname "$0")/.."
dst=.deps/include
rm -rf .deps && mkdir -p "$dst"
cp -r /usr/include/eigen3 "$dst/"
cp -r /usr/include/spdlog /usr/include/fmt /usr/include/CLI /usr/include/catch2 /usr/include/nlohmann "$dst/"
# SentencePiece (train --task translate): its headers and shared libraries,
# which need only libstdc++/libc, so Debian 12's build runs on Ubuntu 24.04.
if [[ -f /usr/include/sentencepiece_processor.h ]]; then
  cp /usr/include/sentencepiece_processor.h /usr/include/sentencepiece_trainer.h "$dst/"
  mkdir -p .deps/lib
  cp -L /usr/lib/x86_64-linux-gnu/libsentencepiece.so.0 /usr/lib/x86_64-linux-gnu/libsentencepiece_train.so.0 .deps/lib/
fi
du -sh .deps
