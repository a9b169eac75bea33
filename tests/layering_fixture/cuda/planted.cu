#include "models/linear.hpp"  // planted: cuda -> models
