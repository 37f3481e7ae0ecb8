// tessera-batch (coordinator/api/batch_jsonl.h) as a user runs it: a real JSONL of 500 mixed
// requests through the real program and its worker, every result line checked against the
// same request sent to a real tessera-serve over HTTP.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/test_support.h"
#include "tests/tools/serve_process.h"

namespace tessera {
namespace {

using nlohmann::json;

std::string batch_model() { return testing::fixtures_dir() + "/kjv-llama"; }

std::string line_of(const std::string& id, const std::string& url, const json& body) {
  return json{{"custom_id", id}, {"method", "POST"}, {"url", url}, {"body", body}}.dump();
}

// The i-th request of the mixed batch, and (for an invalid line) the error code or HTTP status
// its result must carry.
struct BatchCase {
  std::string line;
  std::string custom_id;  // "" when the line has none
  std::string url;
  json body;
  std::string line_error;  // the result's error.code
  int status = 200;        // the response's status_code when the line is a request
};

BatchCase batch_case(int i) {
  const std::string id = "req-" + std::to_string(i);
  const std::vector<std::string> verses = {"In the beginning", "And God said", "The LORD is my shepherd",
                                           "Blessed are the", "And it came to pass"};
  const std::string prompt = verses[static_cast<size_t>(i) % verses.size()] + (i % 3 ? "" : ", and");
  BatchCase c;
  c.custom_id = id;
  const int kind = i % 10;
  if (kind == 0) {  // invalid, seven ways
    switch ((i / 10) % 7) {
      case 0: c.line = "{not json"; c.custom_id = ""; c.line_error = "invalid_json"; return c;
      case 1:
        c.line = json{{"method", "POST"}, {"url", "/v1/completions"}, {"body", {{"prompt", "x"}}}}.dump();
        c.custom_id = "";
        c.line_error = "missing_custom_id";
        return c;
      case 2:
        c.line = json{{"custom_id", id}, {"method", "GET"}, {"url", "/v1/completions"}, {"body", json::object()}}.dump();
        c.line_error = "invalid_method";
        return c;
      case 3: c.line = line_of(id, "/v1/moderations", {{"input", "x"}}); c.line_error = "invalid_url"; return c;
      case 4:
        c.line = line_of(id, "/v1/completions", {{"prompt", "x"}, {"stream", true}});
        c.line_error = "invalid_body";
        return c;
      case 5: c.url = "/v1/completions"; c.body = {{"prompt", "x"}, {"max_tokens", 0}}; c.status = 400; break;
      default: c.url = "/v1/completions"; c.body = {{"prompt", "x"}, {"model", "no-such-model"}}; c.status = 404; break;
    }
  } else if (kind <= 3) {
    c.url = "/v1/chat/completions";
    c.body = {{"messages", {{{"role", "user"}, {"content", prompt}}}}, {"max_tokens", 2 + i % 9}, {"temperature", 0}};
  } else if (kind == 4) {
    c.url = "/v1/completions";
    c.body = {{"prompt", {prompt, "And Adam"}}, {"max_tokens", 6}, {"temperature", 0}, {"logprobs", 2}};
  } else if (kind == 5) {
    c.url = "/v1/embeddings";
    c.body = {{"input", prompt}};
  } else {
    c.url = "/v1/completions";
    c.body = {{"prompt", prompt}, {"max_tokens", 1 + i % 13}, {"temperature", 0}, {"stop", {" of"}}};
  }
  c.line = line_of(id, c.url, c.body);
  return c;
}

// What must match between the batch's and the online response: everything but the ids and
// times; logprobs and embeddings within float tolerance (the batch computes them in other
// batches than the online server).
void expect_same_response(const json& batch, const json& online, const std::string& where) {
  if (online.contains("error")) {
    EXPECT_EQ(batch["error"], online["error"]) << where;
    return;
  }
  EXPECT_EQ(batch["object"], online["object"]) << where;
  EXPECT_EQ(batch["model"], online["model"]) << where;
  EXPECT_EQ(batch["usage"], online["usage"]) << where;
  if (online.contains("data")) {
    ASSERT_EQ(batch["data"].size(), online["data"].size()) << where;
    for (size_t d = 0; d < online["data"].size(); ++d) {
      const json& a = batch["data"][d]["embedding"];
      const json& b = online["data"][d]["embedding"];
      ASSERT_EQ(a.size(), b.size()) << where;
      for (size_t k = 0; k < a.size(); ++k) ASSERT_NEAR(a[k].get<double>(), b[k].get<double>(), 1e-4) << where;
    }
    return;
  }
  ASSERT_EQ(batch["choices"].size(), online["choices"].size()) << where;
  for (size_t k = 0; k < online["choices"].size(); ++k) {
    json a = batch["choices"][k], b = online["choices"][k];
    EXPECT_EQ(a["finish_reason"], b["finish_reason"]) << where;
    EXPECT_EQ(a.value("text", json()), b.value("text", json())) << where;
    EXPECT_EQ(a.value("message", json()), b.value("message", json())) << where;
    if (b.contains("logprobs") && b["logprobs"].is_object()) {
      EXPECT_EQ(a["logprobs"]["tokens"], b["logprobs"]["tokens"]) << where;
      const json& la = a["logprobs"]["token_logprobs"];
      const json& lb = b["logprobs"]["token_logprobs"];
      ASSERT_EQ(la.size(), lb.size()) << where;
      for (size_t t = 0; t < lb.size(); ++t) EXPECT_NEAR(la[t].get<double>(), lb[t].get<double>(), 1e-3) << where;
    }
  }
}

TEST(TesseraBatch, FiveHundredMixedRequestsGiveOneResultEachAsTheOnlineApiDoes) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string dir = testing::make_temp_dir("tessera-batch");
  // Under the sanitizers (several times slower; they look for memory errors, which the same
  // mix of lines reaches sooner) 100 of them.
  constexpr int kRequests = testing::kSanitizedBuild ? 100 : 500;
  std::vector<BatchCase> cases;
  std::ostringstream in;
  for (int i = 0; i < kRequests; ++i) {
    cases.push_back(batch_case(i));
    in << cases.back().line << "\n";
    if (i % 97 == 0) in << "\n";  // blank lines are not requests
  }
  testing::write_file(dir + "/in.jsonl", in.str());
  const testing::CommandResult run =
      testing::run_command(testing::bin_dir() + "/tessera-batch " + dir + "/in.jsonl " + dir + "/out.jsonl --model " +
                           batch_model() + " --threads 1 --progress-s 0.2 --max-in-flight 64");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.out.find(std::to_string(kRequests) + " requests"), std::string::npos) << run.out;
  EXPECT_NE(run.err.find("batch: "), std::string::npos) << "progress is reported";

  // One result per request line; results of lines without a custom_id have it null.
  std::map<std::string, json> results;
  int anonymous = 0;
  std::istringstream out(testing::read_file(dir + "/out.jsonl"));
  for (std::string text; std::getline(out, text);) {
    const json r = json::parse(text, nullptr, false);
    ASSERT_FALSE(r.is_discarded()) << text;
    ASSERT_TRUE(r["id"].is_string()) << text;
    if (r["custom_id"].is_null()) {
      ++anonymous;
      EXPECT_TRUE(r["response"].is_null()) << text;
      continue;
    }
    EXPECT_TRUE(results.emplace(r["custom_id"].get<std::string>(), r).second) << "a second result for " << text;
  }
  int expected_anonymous = 0;
  for (const BatchCase& c : cases) expected_anonymous += c.custom_id.empty() ? 1 : 0;
  EXPECT_EQ(anonymous, expected_anonymous);
  EXPECT_EQ(results.size() + static_cast<size_t>(anonymous), static_cast<size_t>(kRequests));

  testing::ServeProcess server;
  ASSERT_TRUE(server.start({"--model", batch_model(), "--backend", "cpu", "--threads", "1"})) << server.log();
  int compared = 0;
  for (const BatchCase& c : cases) {
    if (c.custom_id.empty()) continue;
    const auto found = results.find(c.custom_id);
    ASSERT_NE(found, results.end()) << c.custom_id << " has no result";
    const json& r = found->second;
    if (!c.line_error.empty()) {
      EXPECT_TRUE(r["response"].is_null()) << r;
      EXPECT_EQ(r["error"]["code"], c.line_error) << r;
      EXPECT_NE(r["error"]["message"].get<std::string>().find("line "), std::string::npos) << r;
      continue;
    }
    EXPECT_TRUE(r["error"].is_null()) << r;
    ASSERT_EQ(r["response"]["status_code"], c.status) << r;
    const std::string online = testing::http(server.port(), "POST", c.url, c.body.dump());
    ASSERT_EQ(testing::http_status(online), c.status) << online;
    expect_same_response(r["response"]["body"], json::parse(testing::http_body(online)), c.custom_id);
    ++compared;
  }
  EXPECT_GT(compared, kRequests * 4 / 5);
}

// A signal mid-batch: no further line starts, the running ones are cut and say so, every line
// written is whole, and the exit code says the batch did not finish.
TEST(TesseraBatch, ASignalStopsTheBatchAndKeepsTheResultsWritten) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string dir = testing::make_temp_dir("tessera-batch-signal");
  constexpr int kRequests = 3000;  // 768k tokens: far longer than the second it is given
  std::ostringstream in;
  for (int i = 0; i < kRequests; ++i)
    in << line_of("r" + std::to_string(i), "/v1/completions",
                  {{"prompt", "In the beginning"}, {"max_tokens", 256}, {"ignore_eos", true}})
       << "\n";
  testing::write_file(dir + "/in.jsonl", in.str());
  // The signal once the batch runs (its first line is logged), as a user's Ctrl-C would come.
  const std::string err = dir + "/err.txt";
  const testing::CommandResult run = testing::run_command(
      "(" + testing::bin_dir() + "/tessera-batch " + dir + "/in.jsonl " + dir + "/out.jsonl --model " + batch_model() +
      " --threads 1 --max-in-flight 32 2> " + err + " & pid=$!; for i in $(seq 1 1200); do grep -q 'requests in flight' " +
      err + " && break; sleep 0.05; done; sleep 1; kill -TERM $pid; wait $pid; status=$?; cat " + err + " >&2; exit $status)");
  EXPECT_EQ(run.exit_code, 1) << run.err;
  EXPECT_NE(run.err.find("the batch was cancelled: "), std::string::npos) << "stderr: " << run.err << "\nstdout: " << run.out;
  std::istringstream out(testing::read_file(dir + "/out.jsonl"));
  std::set<std::string> ids;
  int cut = 0, lines = 0;
  for (std::string text; std::getline(out, text); ++lines) {
    const json r = json::parse(text, nullptr, false);
    ASSERT_FALSE(r.is_discarded()) << "a line cut short: " << text;
    EXPECT_TRUE(ids.insert(r["custom_id"].get<std::string>()).second);
    if (r["response"]["status_code"] == 503) {
      EXPECT_EQ(r["response"]["body"]["error"]["code"], "cancelled") << r;
      ++cut;
    } else {
      EXPECT_EQ(r["response"]["status_code"], 200) << r;
    }
  }
  EXPECT_LT(lines, kRequests);
  EXPECT_GE(cut, 1) << "the requests running at the signal were cut";
  EXPECT_LE(cut, 32) << "only those in flight";
}

TEST(TesseraBatch, PathsThatCannotWorkStopItWithOneLine) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string dir = testing::make_temp_dir("tessera-batch-paths");
  const std::string request = line_of("a", "/v1/completions", {{"prompt", "x"}}) + "\n";
  testing::write_file(dir + "/in.jsonl", request);
  const std::string bin = testing::bin_dir() + "/tessera-batch ";
  const testing::CommandResult missing = testing::run_command(bin + dir + "/nope.jsonl " + dir + "/out.jsonl --model " + batch_model());
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.err.find("nope.jsonl' is not a readable file"), std::string::npos) << missing.err;
  const testing::CommandResult same = testing::run_command(bin + dir + "/in.jsonl " + dir + "/./in.jsonl --model " + batch_model());
  EXPECT_EQ(same.exit_code, 1);
  EXPECT_NE(same.err.find("is IN"), std::string::npos) << same.err;
  EXPECT_EQ(testing::read_file(dir + "/in.jsonl"), request) << "the input is untouched";
  const testing::CommandResult unwritable =
      testing::run_command(bin + dir + "/in.jsonl " + dir + "/no/such/dir/out.jsonl --model " + batch_model());
  EXPECT_EQ(unwritable.exit_code, 1);
  EXPECT_NE(unwritable.err.find("cannot be written"), std::string::npos) << unwritable.err;
  const testing::CommandResult bad_key =
      testing::run_command(bin + dir + "/in.jsonl " + dir + "/out.jsonl --model " + batch_model() + " --set scheduler.max_tpot_slowdown=-1");
  EXPECT_EQ(bad_key.exit_code, 1);
  EXPECT_NE(bad_key.err.find("scheduler.max_tpot_slowdown"), std::string::npos) << bad_key.err;
}

}  // namespace
}  // namespace tessera
