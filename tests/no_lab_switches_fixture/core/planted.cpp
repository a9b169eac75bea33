#include <cstdlib>
// std::getenv("HG_IN_COMMENT") is only named in this comment.
int planted_variant() { return std::getenv("HG_PLANTED_VARIANT") != nullptr; }
