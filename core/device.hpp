#pragma once

namespace hg {

enum class Device { CPU, CUDA };

const char* device_name(Device d);

// True when handgrad was built with CUDA *and* a GPU is visible at run time.
bool cuda_available();

}  // namespace hg
