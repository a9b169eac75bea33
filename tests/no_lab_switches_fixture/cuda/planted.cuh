#pragma once
#include "cuda/lab_switch.hpp"
inline hg::gpu::LabSwitch& planted_lab_switch() {
  static hg::gpu::LabSwitch s("HG_PLANTED_SWITCH", 2);
  return s;
}
inline int planted_variant() { return planted_lab_switch().pick(0); }
