#include "core/device.hpp"

#include "core/cuda_runtime.hpp"

namespace hg {

const char* device_name(Device d) {
  switch (d) {
    case Device::CPU: return "cpu";
    case Device::CUDA: return "cuda";
  }
  return "unknown-device";
}

bool cuda_available() {
  // device_count() is 0 in a CPU-only build and when the driver sees no GPU.
  return gpu::device_count() > 0;
}

}  // namespace hg
