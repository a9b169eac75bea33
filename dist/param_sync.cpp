#include "dist/param_sync.hpp"

#include <cstdio>
#include <sstream>

#include "core/checkpoint.hpp"
#include "core/error.hpp"
#include "dist/world.hpp"

namespace hg::dist {

uint64_t hash_parameters(const std::vector<Parameter*>& params) {
  uint64_t h = 0;
  for (const Parameter* p : params) {
    const Tensor host = p->value.to(Device::CPU);
    h = h * 1099511628211ull ^ checkpoint_checksum(static_cast<const char*>(host.raw_data()), host.nbytes());
  }
  return h;
}

uint64_t check_parameters_in_sync(const std::vector<Parameter*>& params, long long step) {
  const uint64_t mine = hash_parameters(params);
  const std::vector<uint64_t> all = all_gather(mine, "gather of the parameter hashes");
  bool same = true;
  for (uint64_t h : all) same = same && h == all[0];
  if (same) return mine;
  std::ostringstream os;
  for (size_t r = 0; r < all.size(); ++r) {
    char hex[24];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(all[r]));
    os << (r ? ", " : "") << "rank " << r << " " << hex;
  }
  fail("dist::check_parameters_in_sync", "the parameters differ across ranks after step ", step, ": ", os.str());
}

}  // namespace hg::dist
