// The run record beside a checkpoint (examples/common/run_record.hpp): a
// round trip keeps every field, and a missing, damaged or foreign file is
// refused with a message naming the file and what is wrong; the corpus of
// the fuzz target (tests/corpus/run_record) replayed.
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "examples/common/run_record.hpp"
#include "tests/test_files.hpp"
#include "tests/test_util.hpp"

using hg::cli::load_run_record;
using hg::cli::run_record_path;
using hg::cli::RunRecord;
using hg::cli::save_run_record;
using nlohmann::json;

namespace {

RunRecord sample_record() {
  RunRecord r;
  r.task = "data";
  r.tokenizer = "bpe";
  r.flags = {{"d-model", 96}, {"lr", 0.003}, {"data", "corpus.txt"}, {"unfused", false}, {"tokenizer", "bpe"}};
  r.model.vocab_size = 2048;
  r.model.max_seq_len = 128;
  r.model.d_model = 96;
  r.model.n_heads = 4;
  r.model.n_layers = 3;
  r.model.ffn_hidden = 200;
  r.model.ln_eps = 1e-6;
  r.model.dropout = 0.125;
  return r;
}

// The record written by sample_record, edited by `edit`, written back as text.
std::string edited_record(const std::string& ck, void (*edit)(json&)) {
  save_run_record(ck, sample_record());
  json j = json::parse(hg::test::read_bytes(run_record_path(ck)));
  edit(j);
  hg::test::write_bytes(run_record_path(ck), j.dump());
  return run_record_path(ck);
}

}  // namespace

TEST_CASE("run record: a round trip keeps every field, the file is plain JSON") {
  const auto dir = hg::test::make_temp_dir("run_record");
  const std::string ck = (dir / "lm").string();
  CHECK(run_record_path(ck) == ck + ".json");
  const RunRecord r = sample_record();
  save_run_record(ck, r);
  CHECK_FALSE(std::filesystem::exists(ck + ".json.tmp"));  // renamed into place
  const RunRecord back = load_run_record(ck);
  CHECK(back.task == "data");
  CHECK(back.tokenizer == "bpe");
  CHECK(back.flags == r.flags);
  CHECK(back.flags["lr"].get<double>() == 0.003);
  CHECK(back.model.vocab_size == 2048);
  CHECK(back.model.max_seq_len == 128);
  CHECK(back.model.d_model == 96);
  CHECK(back.model.n_heads == 4);
  CHECK(back.model.n_layers == 3);
  CHECK(back.model.ffn_hidden == 200);
  CHECK(back.model.ln_eps == 1e-6);
  CHECK(back.model.dropout == 0.125);
  const json j = json::parse(hg::test::read_bytes(ck + ".json"));
  CHECK(j["format"] == "handgrad-run");
  CHECK(j["version"] == 1);
  CHECK(j["model"]["d_model"] == 96);
  CHECK(j["flags"]["data"] == "corpus.txt");

  // A second save replaces the first.
  RunRecord other = r;
  other.task = "synthetic";
  other.tokenizer = "synthetic";
  other.model.d_model = 64;
  save_run_record(ck, other);
  CHECK(load_run_record(ck).model.d_model == 64);
  CHECK(load_run_record(ck).task == "synthetic");
  std::filesystem::remove_all(dir);
}

TEST_CASE("run record: missing, damaged and foreign files are refused, naming the file") {
  const auto dir = hg::test::make_temp_dir("run_record_bad");
  const std::string ck = (dir / "lm").string(), path = ck + ".json";
  using Catch::Contains;
  CHECK_THROWS_WITH(load_run_record(ck), Contains(path) && Contains("does not exist"));
  std::filesystem::create_directory(path);
  CHECK_THROWS_WITH(load_run_record(ck), Contains(path) && Contains("not a regular file"));
  std::filesystem::remove(path);

  save_run_record(ck, sample_record());
  const std::string good = hg::test::read_bytes(path);
  hg::test::write_bytes(path, good.substr(0, good.size() / 2));  // cut short
  CHECK_THROWS_WITH(load_run_record(ck), Contains(path) && Contains("not JSON"));
  hg::test::write_bytes(path, "");
  CHECK_THROWS_WITH(load_run_record(ck), Contains(path) && Contains("not JSON"));
  hg::test::write_bytes(path, "[1, 2]");
  CHECK_THROWS_WITH(load_run_record(ck), Contains(path) && Contains("not a handgrad run record"));

  CHECK_THROWS_WITH(load_run_record((edited_record(ck, [](json& j) { j["format"] = "other"; }), ck)),
                    Contains(path) && Contains("not a handgrad run record") && Contains("\"other\""));
  CHECK_THROWS_WITH(load_run_record((edited_record(ck, [](json& j) { j.erase("format"); }), ck)),
                    Contains("\"format\" is missing"));
  CHECK_THROWS_WITH(load_run_record((edited_record(ck, [](json& j) { j["version"] = 2; }), ck)),
                    Contains(path) && Contains("version 2; this handgrad reads version 1"));
  CHECK_THROWS_WITH(load_run_record((edited_record(ck, [](json& j) { j["model"].erase("d_model"); }), ck)),
                    Contains(path) && Contains("missing key 'model.d_model'"));
  CHECK_THROWS_WITH(load_run_record((edited_record(ck, [](json& j) { j.erase("task"); }), ck)),
                    Contains("missing key 'task'"));
  CHECK_THROWS_WITH(load_run_record((edited_record(ck, [](json& j) { j.erase("flags"); }), ck)),
                    Contains("missing key 'flags'"));
  CHECK_THROWS_WITH(load_run_record((edited_record(ck, [](json& j) { j["flags"] = 3; }), ck)),
                    Contains("missing key 'flags' (an object)"));
  CHECK_THROWS_WITH(load_run_record((edited_record(ck, [](json& j) { j["model"]["n_layers"] = "four"; }), ck)),
                    Contains(path) && Contains("key 'model.n_layers' is \"four\", not a whole number"));
  CHECK_THROWS_WITH(load_run_record((edited_record(ck, [](json& j) { j["model"]["d_model"] = 96.5; }), ck)),
                    Contains("key 'model.d_model' is 96.5, not a whole number"));
  // Past the field's range: refused as written, never read wrapped (as version 1, as a negative size).
  CHECK_THROWS_WITH(load_run_record((edited_record(ck, [](json& j) { j["version"] = 4294967297LL; }), ck)),
                    Contains("key 'version' is 4294967297, not a whole number in [-2^31, 2^31)"));
  CHECK_THROWS_WITH(
      load_run_record((edited_record(ck, [](json& j) { j["model"]["d_model"] = 9223372036854775808ULL; }), ck)),
      Contains("key 'model.d_model' is 9223372036854775808, not a whole number in [-2^63, 2^63)"));
  CHECK_THROWS_WITH(load_run_record((edited_record(ck, [](json& j) { j["model"]["n_heads"] = 0; }), ck)),
                    Contains("model.n_heads is 0; must be at least 1"));
  CHECK_THROWS_WITH(load_run_record((edited_record(ck, [](json& j) { j["model"]["n_heads"] = 5; }), ck)),
                    Contains("model.n_heads 5 does not divide model.d_model 96"));
  CHECK_THROWS_WITH(load_run_record((edited_record(ck, [](json& j) { j["model"]["ffn_hidden"] = -1; }), ck)),
                    Contains("model.ffn_hidden is -1; must be at least 0"));
  CHECK_THROWS_WITH(load_run_record((edited_record(ck, [](json& j) { j["model"]["dropout"] = 1.5; }), ck)),
                    Contains("model.dropout is 1.5; must be in [0, 1)"));
  CHECK_THROWS_WITH(load_run_record((edited_record(ck, [](json& j) { j["model"]["ln_eps"] = 0; }), ck)),
                    Contains("model.ln_eps is 0; must be in (0, 1)"));
  CHECK_THROWS_WITH(load_run_record((edited_record(ck,
                                                   [](json& j) {
                                                     j["tokenizer"] = "bytes";
                                                     j["task"] = "translate";
                                                   }),
                                     ck)),
                    Contains("task \"translate\" with tokenizer \"bytes\""));
  CHECK_THROWS_WITH(load_run_record((edited_record(ck, [](json& j) { j["task"] = "images"; }), ck)),
                    Contains("task \"images\" with tokenizer \"bpe\""));

  RunRecord bad = sample_record();
  bad.tokenizer = "synthetic";
  CHECK_THROWS_WITH(save_run_record(ck, bad), Contains("task 'data' with tokenizer 'synthetic'"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("run record: taken back into the flags of a resumed run, checked against what they rebuild") {
  const auto dir = hg::test::make_temp_dir("run_record_take");
  const std::string ck = (dir / "lm").string();
  int64_t d_model = 64;
  std::string device = "auto";
  CLI::App app;
  app.add_option("--d-model", d_model);
  app.add_option("--device", device);
  app.parse(std::vector<std::string>{});
  CHECK_FALSE(hg::cli::take_run_record(app, ck, {"device"}, {}).has_value());  // none yet: an older checkpoint

  RunRecord r = sample_record();
  r.flags = {{"d-model", 96}, {"device", "cpu"}};
  save_run_record(ck, r);
  const auto taken = hg::cli::take_run_record(app, ck, {"device"}, {});
  REQUIRE(taken.has_value());
  CHECK(d_model == 96);     // from the record
  CHECK(device == "auto");  // per invocation: not taken
  CHECK(taken->model.d_model == 96);

  hg::cli::check_run_record(r, r, ck);
  RunRecord other = r;
  other.model.n_layers = 4;
  CHECK_THROWS_WITH(hg::cli::check_run_record(r, other, ck),
                    Catch::Contains(ck + ".json: records task data, tokenizer bpe, model vocab 2048 seq 128 d_model 96 "
                                         "heads 4 layers 3") &&
                        Catch::Contains("but its flags give task data, tokenizer bpe, model vocab 2048 seq 128 "
                                        "d_model 96 heads 4 layers 4"));
  other = r;
  other.tokenizer = "bytes";
  CHECK_THROWS_WITH(hg::cli::check_run_record(r, other, ck), Catch::Contains("edited or damaged"));
  std::filesystem::remove_all(dir);
}

// The seeds and any finding of tests/fuzz/fuzz_run_record.cpp: each file
// loads (and saved again, loads to the same record) or is refused with
// hg::Error naming it. seed_valid_* must load, the other seed_* must not.
TEST_CASE("run record corpus: every file loads and reads back, or is refused naming the file") {
  namespace fs = std::filesystem;
  const auto files = hg::test::corpus_files("run_record");
  REQUIRE(files.size() >= 10);
  const auto dir = hg::test::make_temp_dir("run_record_corpus");
  const std::string ck = (dir / "lm").string();
  for (const fs::path& p : files) {
    const std::string name = p.filename().string();
    INFO(name);
    hg::test::write_bytes(run_record_path(ck), hg::test::read_bytes(p));
    bool ok = true;
    RunRecord r;
    try {
      r = load_run_record(ck);
    } catch (const hg::Error& e) {
      ok = false;
      REQUIRE(std::string(e.what()).find(run_record_path(ck)) != std::string::npos);
    }
    if (ok) {
      save_run_record(ck, r);
      const RunRecord again = load_run_record(ck);
      CHECK(again.flags == r.flags);
      CHECK(again.task == r.task);
      CHECK(again.model.d_model == r.model.d_model);
      CHECK(again.model.ln_eps == r.model.ln_eps);
    }
    if (name.rfind("seed_valid_", 0) == 0) CHECK(ok);
    else if (name.rfind("seed_", 0) == 0) CHECK_FALSE(ok);
  }
  fs::remove_all(dir);
}
