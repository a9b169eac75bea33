#include "dist/world.hpp"  // planted: models -> dist
