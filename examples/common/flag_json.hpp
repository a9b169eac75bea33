#pragma once
// A program's flags as JSON, keyed by their long names without "--":
//   --config FILE.json   flags read from a file ({"d-model": 96, "data": "x.txt"});
//                        the command line wins over the file
//   flag_values          every flag's value after the program resolved it
//                        (what train stores in its run record)
//   take_recorded_flags  a recorded run's flags taken back (train --resume)
// A JSON value has the flag's type: true/false for a switch, a whole number
// for an integer flag, a number for a real one, a string for the rest.
#include <set>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

namespace hg::cli {

// Adds --config FILE.json to `app`. A key that is not a flag of `app`, a
// value of the wrong type, a file that cannot be read or is not a JSON object
// is a usage error naming the file, the key and what is allowed.
void add_json_config(CLI::App& app);

// Every long flag of `app` but --help, --version and --config -> its current
// value (after parsing: the bound variables as the program left them).
nlohmann::json flag_values(CLI::App& app);

// Takes the flags recorded by a run (`recorded`, read from `source`) back
// into `app`, after parsing. Flags in `per_invocation` are never taken. The
// others, when not given (command line or --config), get the recorded value;
// when given, those in `changeable` keep the given value and every other one
// must equal the recorded value, else a UsageError names both.
void take_recorded_flags(CLI::App& app, const nlohmann::json& recorded, const std::set<std::string>& per_invocation,
                         const std::set<std::string>& changeable, const std::string& source);

}  // namespace hg::cli
