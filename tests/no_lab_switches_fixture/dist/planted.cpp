#include <cstdlib>
bool planted_loop() {
  for (const char* var : {"HG_PLANTED_A", "HG_PLANTED_B"})
    if (std::getenv(var)) return true;
  return false;
}
