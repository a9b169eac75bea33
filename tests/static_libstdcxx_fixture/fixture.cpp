// Formats a double through std::ostream: pulls libstdc++'s locale code in.
#include <sstream>
#include <string>

std::string hg_fixture_format(double x) {
  std::ostringstream s;
  s << x;
  return s.str();
}
