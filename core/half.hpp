#pragma once
#include "core/dtype.hpp"

namespace hg {

// IEEE 754 binary16 on the host. float -> half rounds to nearest even,
// overflows to +-inf, keeps subnormals, and NaN stays NaN.
f16_t float_to_half(float f);
float half_to_float(f16_t h);

}  // namespace hg
