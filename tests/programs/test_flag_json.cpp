// Flags as JSON (examples/common/flag_json.hpp): --config files, the values
// a run records and their return on --resume, on a small CLI11 app with one
// flag of each kind.
#include <filesystem>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "examples/common/cli.hpp"
#include "examples/common/flag_json.hpp"
#include "tests/test_files.hpp"
#include "tests/test_util.hpp"

using Catch::Contains;
using nlohmann::json;

namespace {

struct Flags {
  int64_t width = 64;
  double lr = 3e-3;
  std::string data, mode = "fast";
  bool fancy = false;
};

struct TestApp {
  Flags f;
  CLI::App app{"test", "prog"};
  TestApp() {
    app.add_option("--width", f.width, "an integer")->check(CLI::Range(int64_t{1}, int64_t{1000}));
    app.add_option("--lr", f.lr, "a real number");
    app.add_option("--data", f.data, "a string");
    app.add_option("--mode", f.mode, "a choice")->check(CLI::IsMember({"fast", "slow"}));
    app.add_flag("--fancy", f.fancy, "a switch");
    hg::cli::add_json_config(app);
  }
  // Parses `args`; returns "" or the parse error's message.
  std::string parse(std::vector<std::string> args) {
    std::vector<const char*> argv{"prog"};
    for (const std::string& a : args) argv.push_back(a.c_str());
    try {
      app.parse(static_cast<int>(argv.size()), const_cast<char**>(argv.data()));
    } catch (const CLI::ParseError& e) {
      return e.what();
    }
    return "";
  }
};

}  // namespace

TEST_CASE("flag_json: --config sets flags, the command line wins") {
  const auto dir = hg::test::make_temp_dir("flag_json_config");
  const std::string file = (dir / "c.json").string();
  hg::test::write_bytes(file, R"({"width": 96, "lr": 1e-4, "data": "x.txt", "fancy": true, "mode": "slow"})");
  TestApp t;
  REQUIRE(t.parse({"--config", file, "--width", "128"}) == "");
  CHECK(t.f.width == 128);  // the command line wins
  CHECK(t.f.lr == 1e-4);
  CHECK(t.f.data == "x.txt");
  CHECK(t.f.fancy);
  CHECK(t.f.mode == "slow");
  // A real number written as a whole number is fine; false leaves a switch off.
  hg::test::write_bytes(file, R"({"lr": 1, "fancy": false})");
  TestApp u;
  REQUIRE(u.parse({"--config", file}) == "");
  CHECK(u.f.lr == 1.0);
  CHECK_FALSE(u.f.fancy);
  std::filesystem::remove_all(dir);
}

TEST_CASE("flag_json: a bad --config file is refused, naming the file, the key and what is allowed") {
  const auto dir = hg::test::make_temp_dir("flag_json_bad");
  const std::string file = (dir / "c.json").string();
  const auto refused = [&](const std::string& text) {
    hg::test::write_bytes(file, text);
    TestApp t;
    return t.parse({"--config", file});
  };
  CHECK_THAT(refused(R"({"widht": 96})"),
             Contains("--config " + file + ": key 'widht' is not a flag of prog") &&
                 Contains("allowed: the long flag names without --: width, lr, data, mode, fancy"));
  CHECK_THAT(refused(R"({"--width": 96})"), Contains("key '--width' is not a flag"));
  CHECK_THAT(refused(R"({"config": "other.json"})"), Contains("key 'config' is not a flag"));
  CHECK_THAT(refused(R"({"help": true})"), Contains("key 'help' is not a flag"));
  CHECK_THAT(refused(R"({"width": "96"})"), Contains(file + ": key 'width' is \"96\"; --width takes a whole number"));
  CHECK_THAT(refused(R"({"width": 9.5})"), Contains("key 'width' is 9.5; --width takes a whole number"));
  CHECK_THAT(refused(R"({"lr": "fast"})"), Contains("key 'lr' is \"fast\"; --lr takes a number"));
  CHECK_THAT(refused(R"({"fancy": 1})"), Contains("key 'fancy' is 1; --fancy takes true or false"));
  CHECK_THAT(refused(R"({"data": null})"), Contains("key 'data' is null; --data takes a string"));
  CHECK_THAT(refused(R"({"data": ["a", "b"]})"), Contains("key 'data' is [\"a\",\"b\"]; --data takes a string"));
  CHECK_THAT(refused(R"({"width": 5000})"), Contains("--width") && Contains("5000"));  // the flag's own check
  CHECK_THAT(refused(R"({"mode": "medium"})"), Contains("--mode") && Contains("medium"));
  CHECK_THAT(refused(R"({"width": 96,)"), Contains(file + ": is not JSON"));
  CHECK_THAT(refused(""), Contains(file + ": is not JSON"));
  CHECK_THAT(refused("[1, 2]"), Contains(file + ": is a JSON array, not an object of flags"));
  TestApp t;
  CHECK_THAT(t.parse({"--config", (dir / "none.json").string()}), Contains("--config") && Contains("none.json"));
  TestApp d;
  CHECK_THAT(d.parse({"--config", dir.string()}), Contains("--config") && Contains(dir.string()));
  std::filesystem::remove_all(dir);
}

TEST_CASE("flag_json: flag_values holds every flag with its type and current value") {
  TestApp t;
  REQUIRE(t.parse({"--width", "32", "--lr", "0.000123456789", "--fancy"}) == "");
  t.f.mode = "slow";  // resolved by the program after parsing
  const json v = hg::cli::flag_values(t.app);
  CHECK(v == json{{"width", 32}, {"lr", 0.000123456789}, {"data", ""}, {"mode", "slow"}, {"fancy", true}});
  CHECK(v["width"].is_number_integer());
  TestApp d;
  REQUIRE(d.parse({}) == "");
  CHECK(hg::cli::flag_values(d.app) ==
        json{{"width", 64}, {"lr", 3e-3}, {"data", ""}, {"mode", "fast"}, {"fancy", false}});
}

TEST_CASE("flag_json: recorded flags come back unless given; a contradiction is refused naming both values") {
  const json recorded{{"width", 32}, {"lr", 0.000123456789}, {"data", "a.txt"}, {"mode", "slow"}, {"fancy", true}};
  {
    TestApp t;  // nothing given: everything recorded comes back, exactly
    REQUIRE(t.parse({}) == "");
    hg::cli::take_recorded_flags(t.app, recorded, {}, {}, "ck.json");
    CHECK(t.f.width == 32);
    CHECK(t.f.lr == 0.000123456789);
    CHECK(t.f.data == "a.txt");
    CHECK(t.f.mode == "slow");
    CHECK(t.f.fancy);
    CHECK(hg::cli::flag_values(t.app) == recorded);
  }
  {
    TestApp t;  // per-invocation flags keep their own value, the same value given is fine
    REQUIRE(t.parse({"--width", "32"}) == "");
    hg::cli::take_recorded_flags(t.app, recorded, {"data", "fancy"}, {}, "ck.json");
    CHECK(t.f.width == 32);
    CHECK(t.f.data.empty());
    CHECK_FALSE(t.f.fancy);
  }
  {
    TestApp t;
    REQUIRE(t.parse({"--width", "48"}) == "");
    CHECK_THROWS_WITH(
        hg::cli::take_recorded_flags(t.app, recorded, {}, {}, "ck.json"),
        "--width 48: the checkpoint's run used --width 32 (ck.json); leave the flag out or give that value");
  }
  {
    TestApp t;  // a changeable flag keeps the given value
    REQUIRE(t.parse({"--lr", "0.5"}) == "");
    hg::cli::take_recorded_flags(t.app, recorded, {}, {"lr"}, "ck.json");
    CHECK(t.f.lr == 0.5);
    CHECK(t.f.width == 32);
  }
  {
    TestApp t;  // a switch given off the record
    REQUIRE(t.parse({"--data", "b.txt"}) == "");
    CHECK_THROWS_WITH(hg::cli::take_recorded_flags(t.app, recorded, {}, {}, "ck.json"),
                      Contains("--data b.txt: the checkpoint's run used --data a.txt (ck.json)"));
  }
  {
    TestApp t;  // a damaged record: wrong type, or a value the flag refuses
    REQUIRE(t.parse({}) == "");
    CHECK_THROWS_WITH(hg::cli::take_recorded_flags(t.app, {{"width", "wide"}}, {}, {}, "ck.json"),
                      Contains("--width \"wide\": recorded in ck.json, but --width takes a whole number"));
    CHECK_THROWS_WITH(hg::cli::take_recorded_flags(t.app, {{"width", 5000}}, {}, {}, "ck.json"),
                      Contains("--width 5000: recorded in ck.json, but now refused"));
    CHECK_THROWS_AS(hg::cli::take_recorded_flags(t.app, {{"width", 5000}}, {}, {}, "ck.json"), hg::cli::UsageError);
  }
}
