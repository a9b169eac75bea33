#include "examples/common/step_log.hpp"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include <spdlog/spdlog.h>

#include "core/error.hpp"

namespace hg::cli {
namespace {

constexpr const char* kOp = "StepLog";

// The step in the first field of a row, or -1 when it is not a plain integer.
int64_t row_step(const std::vector<std::string>& fields) {
  if (fields.empty() || fields[0].empty() || fields[0].size() > 15) return -1;
  for (char c : fields[0])
    if (c < '0' || c > '9') return -1;
  return std::stoll(fields[0]);
}

}  // namespace

std::vector<std::string> split_csv_line(const std::string& line) {
  std::vector<std::string> out;
  std::stringstream ss(line);
  std::string field;
  while (std::getline(ss, field, ',')) out.push_back(field);
  if (!line.empty() && line.back() == ',') out.emplace_back();
  return out;
}

StepLog::StepLog(std::string path, std::string header, int64_t resume_step)
    : path_(std::move(path)), header_(std::move(header)) {
  std::string keep = header_ + "\n";
  if (resume_step >= 0) {
    std::ifstream in(path_, std::ios::binary);
    if (!in) {
      spdlog::warn("{}: no log to continue; starting a new one (steps 1..{} are not in it)", path_, resume_step);
    } else {
      std::stringstream ss;
      ss << in.rdbuf();
      const std::string text = ss.str();
      const size_t first_nl = text.find('\n');
      const std::string found = text.substr(0, first_nl);
      HG_CHECK(found == header_, kOp, path_, ": first line is '", found.substr(0, 200), "', expected the header '",
               header_, "'; not a log of this program (move it away or pass another path)");
      int64_t last = 0, missing = 0;
      size_t at = first_nl + 1;
      while (first_nl != std::string::npos && at < text.size()) {
        const size_t nl = text.find('\n', at);
        if (nl == std::string::npos) break;  // a partial last line: the run was killed while writing it
        const std::string line = text.substr(at, nl - at);
        at = nl + 1;
        std::vector<std::string> fields = split_csv_line(line);
        const int64_t step = row_step(fields);
        if (step <= last || step > resume_step) continue;  // later steps are run again
        missing += step - last - 1;
        last = step;
        keep += line + "\n";
        kept_.push_back(std::move(fields));
      }
      missing += resume_step - last;
      if (missing > 0)
        spdlog::warn("{}: {} of the steps 1..{} have no row in the log (written by another run?)", path_, missing,
                     resume_step);
    }
  }
  // Rewritten whole through a temporary and a rename: a crash now leaves the
  // old log or the cut one.
  const std::string tmp = path_ + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << keep;
    out.flush();
    HG_CHECK(out.good(), kOp, "cannot write ", tmp);
  }
  HG_CHECK(std::rename(tmp.c_str(), path_.c_str()) == 0, kOp, "cannot rename ", tmp, " to ", path_, ": ",
           std::strerror(errno));
  file_ = std::fopen(path_.c_str(), "ab");
  HG_CHECK(file_ != nullptr, kOp, "cannot open ", path_, " for appending: ", std::strerror(errno));
}

StepLog::~StepLog() {
  if (file_ != nullptr) std::fclose(file_);
}

void StepLog::row(const std::string& line) {
  const std::string text = line + "\n";
  const bool ok = std::fwrite(text.data(), 1, text.size(), file_) == text.size() && std::fflush(file_) == 0;
  HG_CHECK(ok, kOp, "cannot write to ", path_, ": ", std::strerror(errno));
}

}  // namespace hg::cli
