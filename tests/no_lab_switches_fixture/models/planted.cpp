#include <cstdlib>
bool planted_setting() { return std::getenv("HG_PLANTED_SETTING") != nullptr; }
bool planted_extra() { return std::getenv("HG_PLANTED_EXTRA") != nullptr; }
