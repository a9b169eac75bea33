#pragma once
// Every rank of a data-parallel run must hold the same parameters after each
// step. A 64-bit hash of the values (their bytes, in order) is gathered from
// every rank and compared; a difference is an error naming the ranks.
#include <cstdint>
#include <vector>

#include "core/module.hpp"

namespace hg::dist {

uint64_t hash_parameters(
    const std::vector<Parameter*>& params);  // FNV-1a of each value's bytes, chained (synchronises)
// Throws hg::Error "... parameters differ across ranks after step S: rank 0 hash ..., rank 1 hash ..."
// (every rank throws: each sees every hash). Returns the common hash.
uint64_t check_parameters_in_sync(const std::vector<Parameter*>& params, long long step);

}  // namespace hg::dist
