#pragma once
#include "cuda/lab_switch.hpp"
inline hg::gpu::LabSwitch& planted_switch() {
  static hg::gpu::LabSwitch s("HG_PLANTED_SWITCH", 2);
  return s;
}
