#include "examples/common/flag_json.hpp"

#include <iterator>
#include <sstream>

#include "examples/common/cli.hpp"

namespace hg::cli {

namespace {

using nlohmann::json;

enum class Kind { Switch, Whole, Real, Text };

Kind kind_of(const CLI::Option& o) {
  if (o.get_expected_max() == 0) return Kind::Switch;
  const std::string t = o.get_type_name();  // "INT", "UINT", "FLOAT" or "TEXT", then ":" and the checks
  const auto starts = [&](const char* p) { return t.compare(0, std::string(p).size(), p) == 0; };
  if (starts("INT") || starts("UINT")) return Kind::Whole;
  if (starts("FLOAT")) return Kind::Real;
  return Kind::Text;
}

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::Switch: return "true or false";
    case Kind::Whole: return "a whole number";
    case Kind::Real: return "a number";
    default: return "a string";
  }
}

bool fits(Kind k, const json& v) {
  switch (k) {
    case Kind::Switch: return v.is_boolean();
    case Kind::Whole: return v.is_number_integer();
    case Kind::Real: return v.is_number();
    default: return v.is_string();
  }
}

// The long name without "--", or "" for options that are not flags to keep
// (positionals, --help, --help-all, --version, --config).
std::string flag_name(const CLI::Option& o) {
  if (o.get_lnames().empty()) return "";
  const std::string& n = o.get_lnames().front();
  return n == "help" || n == "help-all" || n == "version" || n == "config" ? "" : n;
}

// A JSON value as a command-line argument (numbers exact: JSON's shortest round trip).
std::string argument(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

// For messages: strings bare ('' when empty), the rest as JSON.
std::string shown(const json& v) {
  if (!v.is_string()) return v.dump();
  const std::string s = v.get<std::string>();
  return s.empty() ? "''" : s;
}

json typed(Kind k, const std::string& text) {
  try {
    if (k == Kind::Whole) return json(std::stoll(text));
    if (k == Kind::Real) return json(std::stod(text));
  } catch (const std::exception&) {
  }
  return json(text);
}

json current_value(CLI::Option& o) {
  const Kind k = kind_of(o);
  if (k == Kind::Switch) return o.count() > 0 && o.as<bool>();
  // A given real number as written: CLI11 prints bound values with 6 digits.
  if (k == Kind::Real && o.count() > 0) return typed(k, o.results().back());
  o.capture_default_str();  // the bound variable's value now, as CLI11 prints it
  return typed(k, o.get_default_str());
}

class JsonConfig : public CLI::Config {
 public:
  explicit JsonConfig(const CLI::App& app) : app_(app) {}

  // The given flags as JSON (what --config reads back).
  std::string to_config(const CLI::App* app, bool, bool, std::string) const override {
    json out = json::object();
    for (const CLI::Option* o : app->get_options()) {
      const std::string name = flag_name(*o);
      if (name.empty() || o->count() == 0) continue;
      const Kind k = kind_of(*o);
      out[name] = k == Kind::Switch ? json(o->as<bool>()) : typed(k, o->results().back());
    }
    return out.dump(2) + "\n";
  }

  std::vector<CLI::ConfigItem> from_config(std::istream& in) const override {
    const std::string file = app_.get_config_ptr()->as<std::string>();
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad()) refuse(file, "cannot be read");
    json j;
    try {
      j = json::parse(text);
    } catch (const json::exception& e) {
      refuse(file, std::string("is not JSON (") + e.what() + ")");
    }
    if (!j.is_object())
      refuse(file, std::string("is a JSON ") + j.type_name() + ", not an object of flags ({\"d-model\": 96, ...})");
    std::vector<CLI::ConfigItem> items;
    for (const auto& [key, value] : j.items()) {
      const CLI::Option* o = key.empty() ? nullptr : app_.get_option_no_throw("--" + key);
      if (o == nullptr || flag_name(*o).empty() || key != flag_name(*o))
        refuse(file, "key '" + key + "' is not a flag of " + app_.get_name() + " (allowed: the long flag names " +
                         "without --: " + allowed() + ")");
      const Kind k = kind_of(*o);
      if (!fits(k, value))
        refuse(file, "key '" + key + "' is " + value.dump() + "; --" + key + " takes " + kind_name(k));
      CLI::ConfigItem item;
      item.name = key;
      item.inputs = {argument(value)};
      items.push_back(std::move(item));
    }
    return items;
  }

 private:
  [[noreturn]] static void refuse(const std::string& file, const std::string& why) {
    throw CLI::ConfigError("--config " + file + ": " + why);
  }
  std::string allowed() const {
    std::string names;
    for (const CLI::Option* o : app_.get_options())
      if (!flag_name(*o).empty()) names += (names.empty() ? "" : ", ") + flag_name(*o);
    return names;
  }
  const CLI::App& app_;
};

}  // namespace

void add_json_config(CLI::App& app) {
  app.set_config("--config", "",
                 "read flags from a JSON object whose keys are the long flag names without -- "
                 "({\"d-model\": 96, \"data\": \"x.txt\"}); flags on the command line win")
      ->check(CLI::ExistingFile);
  app.config_formatter(std::make_shared<JsonConfig>(app));
}

json flag_values(CLI::App& app) {
  json out = json::object();
  for (CLI::Option* o : app.get_options()) {
    const std::string name = flag_name(*o);
    if (!name.empty()) out[name] = current_value(*o);
  }
  return out;
}

void take_recorded_flags(CLI::App& app, const json& recorded, const std::set<std::string>& per_invocation,
                         const std::set<std::string>& changeable, const std::string& source) {
  for (CLI::Option* o : app.get_options()) {
    const std::string name = flag_name(*o);
    if (name.empty() || per_invocation.count(name) != 0) continue;
    const auto it = recorded.find(name);
    if (it == recorded.end()) continue;  // a flag the recording program did not have: its own value
    const json now = current_value(*o);
    if (now == *it) continue;
    if (o->count() > 0) {  // given on the command line or in --config
      if (changeable.count(name) != 0) continue;
      usage_error("--" + name, shown(now), ": the checkpoint's run used --", name, " ", shown(*it), " (", source,
                  "); leave the flag out or give that value");
    }
    const Kind k = kind_of(*o);
    if (!fits(k, *it))
      usage_error("--" + name, it->dump(), ": recorded in ", source, ", but --", name, " takes ", kind_name(k));
    o->clear();
    if (k != Kind::Switch || it->get<bool>()) o->add_result(k == Kind::Switch ? "true" : argument(*it));
    try {
      o->run_callback();
    } catch (const CLI::Error& e) {
      usage_error("--" + name, shown(*it), ": recorded in ", source, ", but now refused: ", e.what());
    }
  }
}

}  // namespace hg::cli
