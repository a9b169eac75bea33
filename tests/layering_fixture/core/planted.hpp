#pragma once
#include "ops/softmax.hpp"  // planted: core -> ops
