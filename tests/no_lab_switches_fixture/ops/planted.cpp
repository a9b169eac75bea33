#include <cstdlib>
bool planted_secure() { return secure_getenv("HG_PLANTED_SECURE") != nullptr; }
