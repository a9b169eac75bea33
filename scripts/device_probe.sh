#!/usr/bin/env bash
# What a GPU machine has: GPU, driver, toolkit, compilers and the build's dependencies.
set -u
export PATH=/usr/local/cuda/bin:$PATH
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
nvcc --version | tail -1; cmake --version | head -1; g++ --version | head -1; which ninja
ls /usr/include | grep -i -E 'eigen|spdlog|fmt|CLI|catch' ; ls /usr/lib/cmake /usr/share/cmake 2>/dev/null | grep -i -E 'catch|eigen|spdlog|fmt|cli'
find / -name 'Catch2Config.cmake' -not -path '*/proc/*' 2>/dev/null | head
python3 -c 'import matplotlib; print("matplotlib", matplotlib.__version__)'
compute-sanitizer --version | head -2
cmake -S . -B /tmp/b -DCMAKE_BUILD_TYPE=Release 2>&1 | tail -15
