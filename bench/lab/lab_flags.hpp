#pragma once
// The command line of a lab program: the flag loop, whole-number and list
// values, and the usage error every lab gives for a bad flag (a message
// naming the flag and what is allowed, exit status 2). Host code only.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace lab {

// s cut at every `sep` ("a,,b" -> "a", "", "b").
inline std::vector<std::string> split(const std::string& s, char sep = ',') {
  std::vector<std::string> out;
  size_t at = 0;
  while (true) {
    const size_t next = s.find(sep, at);
    out.push_back(s.substr(at, next - at));
    if (next == std::string::npos) return out;
    at = next + 1;
  }
}

//   lab::Flags f("x_lab", argc, argv);
//   while (f.next())
//     if (f.is("--iters")) iters = int(f.number(1, 100000));
//     else f.unknown();
class Flags {
 public:
  Flags(const char* program, int argc, char** argv) : program_(program), argc_(argc), argv_(argv) {}

  // Moves to the next flag; false after the last.
  bool next() {
    if (++at_ >= argc_) return false;
    flag_ = argv_[at_];
    return true;
  }
  const std::string& flag() const { return flag_; }
  bool is(const char* name) const { return flag_ == name; }

  // The flag's value: the next argument.
  std::string value() {
    if (at_ + 1 >= argc_) fail(flag_ + " needs a value");
    return argv_[++at_];
  }
  int64_t number(int64_t lo, int64_t hi) { return parse(value(), flag_, lo, hi); }
  // A comma-separated list of whole numbers.
  std::vector<int64_t> numbers(int64_t lo, int64_t hi) {
    std::vector<int64_t> out;
    for (const std::string& item : split(value())) out.push_back(parse(item, flag_, lo, hi));
    return out;
  }

  // A comma-separated list of names, each one of `allowed`.
  std::vector<std::string> choices(const std::vector<std::string>& allowed) {
    std::vector<std::string> out = split(value());
    for (const std::string& v : out)
      if (std::find(allowed.begin(), allowed.end(), v) == allowed.end()) {
        std::string list;
        for (const std::string& a : allowed) list += (list.empty() ? "" : ", ") + a;
        fail(flag_ + ": '" + v + "' is not one of " + list);
      }
    return out;
  }

  int64_t parse(const std::string& text, const std::string& what, int64_t lo, int64_t hi) const {
    char* end = nullptr;
    const long long v = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || v < lo || v > hi)
      fail(what + ": '" + text + "' is not a whole number in " + std::to_string(lo) + ".." + std::to_string(hi));
    return v;
  }

  [[noreturn]] void unknown() const { fail("unknown flag '" + flag_ + "'"); }
  [[noreturn]] void fail(const std::string& what) const {
    std::fprintf(stderr, "%s: %s (see --help)\n", program_, what.c_str());
    std::exit(2);
  }

 private:
  const char* program_;
  int argc_;
  char** argv_;
  int at_ = 0;
  std::string flag_;
};

}  // namespace lab
