#include "../models/linear.hpp"  // planted: ops -> models, written relative
