#pragma once
// One include for Catch2 v2 (Debian 12) and v3 (Ubuntu 24.04).
#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_all.hpp>
#include <string>
// v3 has a real skip: the test is reported as skipped.
#define HG_SKIP(msg) SKIP(msg)
// v2 spellings the tests use, on v3.
using Catch::Approx;
namespace Catch {
inline Matchers::StringContainsMatcher Contains(const std::string& s) { return Matchers::ContainsSubstring(s); }
}  // namespace Catch
#else
#include <catch2/catch.hpp>
// v2 has no skip: warn visibly and leave the test case.
#define HG_SKIP(msg) \
  do {               \
    WARN(msg);       \
    return;          \
  } while (0)
#endif
