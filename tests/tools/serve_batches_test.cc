// The Batch API on a real tessera-serve (kjv-llama): files uploaded as multipart forms over a
// real socket, batches run beside the online API, their result files, the refusals, and a
// restart (killed, or stopped) mid-batch reported as a failed batch with the results it had.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <csignal>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "tests/test_support.h"
#include "tests/tools/raw_http.h"
#include "tests/tools/serve_process.h"

namespace tessera {
namespace {

using nlohmann::json;

std::string batches_model() { return testing::fixtures_dir() + "/kjv-llama"; }

json body_json(const std::string& response) { return json::parse(testing::http_body(response), nullptr, false); }

// POST /v1/files with a multipart form as OpenAI's clients send it.
std::string upload(int port, const std::string& content, const std::string& purpose = "batch") {
  const std::string boundary = "----tessera-test-boundary";
  const std::string form = "--" + boundary + "\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\n" + purpose +
                           "\r\n--" + boundary +
                           "\r\nContent-Disposition: form-data; name=\"file\"; filename=\"requests.jsonl\"\r\n"
                           "Content-Type: application/octet-stream\r\n\r\n" +
                           content + "\r\n--" + boundary + "--\r\n";
  const int fd = testing::connect_loopback(port);
  if (fd < 0) return "";
  const std::string req = "POST /v1/files HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                          "Content-Type: multipart/form-data; boundary=" +
                          boundary + "\r\nContent-Length: " + std::to_string(form.size()) + "\r\n\r\n" + form;
  testing::send_all(fd, req);
  const std::string out = testing::read_until_close(fd, std::chrono::seconds(30));
  close(fd);
  return out;
}

std::string chat_line(const std::string& id, const std::string& content, int max_tokens) {
  return json{{"custom_id", id},
              {"method", "POST"},
              {"url", "/v1/chat/completions"},
              {"body", {{"messages", {{{"role", "user"}, {"content", content}}}}, {"max_tokens", max_tokens}, {"temperature", 0}}}}
      .dump();
}

json create_batch(int port, const std::string& file_id) {
  const std::string r = testing::http(
      port, "POST", "/v1/batches",
      json{{"input_file_id", file_id}, {"endpoint", "/v1/chat/completions"}, {"completion_window", "24h"}}.dump());
  EXPECT_EQ(testing::http_status(r), 200) << r;
  return body_json(r);
}

// Polls the batch until `done` holds for it (or 120 s pass); the last object seen.
template <typename Done>
json poll_batch(int port, const std::string& id, Done done) {
  json b;
  for (int i = 0; i < 1200; ++i) {
    b = body_json(testing::http(port, "GET", "/v1/batches/" + id));
    if (done(b)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return b;
}

std::vector<json> jsonl(const std::string& text) {
  std::vector<json> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(json::parse(line, nullptr, false));
  return out;
}

TEST(ServeBatches, ABatchRunsBesideTheOnlineApiAndWritesItsResultAndErrorFiles) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string dir = testing::make_temp_dir("tessera-batches");
  testing::ServeProcess server;
  ASSERT_TRUE(server.start({"--model", batches_model(), "--threads", "1", "--set", "server.batch_dir=" + dir + "/store"}))
      << server.log();
  const int port = server.port();
  std::string content;
  const std::vector<std::string> prompts = {"Who begat Enos?", "In the beginning", "The LORD is my shepherd"};
  // 500 lines: 470 greedy chat requests, and among them every tenth-and-fifth line not one
  // this batch runs (a broken line, a completion — the batch's endpoint is chat — a refused body).
  // Under the sanitizers 100 lines, 94 of them chat (each kind of line still there; they look
  // for memory errors, which the same code reaches with fewer, at 5x the time).
  constexpr int kLines = testing::kSanitizedBuild ? 100 : 500, kChats = testing::kSanitizedBuild ? 94 : 470;
  std::map<std::string, json> chat_bodies;
  for (int i = 0, chats = 0; i < kLines; ++i) {
    if (i % 17 == 5 && chats + (kLines - i) > kChats) {
      const int which = (i / 17) % 3;
      if (which == 0) content += "{broken\n";
      if (which == 1)
        content += json{{"custom_id", "completion-" + std::to_string(i)}, {"method", "POST"}, {"url", "/v1/completions"},
                        {"body", {{"prompt", "x"}}}}.dump() + "\n";
      if (which == 2)
        content += json{{"custom_id", "refused-" + std::to_string(i)}, {"method", "POST"}, {"url", "/v1/chat/completions"},
                        {"body", {{"messages", 3}}}}.dump() + "\n";
      continue;
    }
    const std::string id = "c" + std::to_string(i);
    const std::string line = chat_line(id, prompts[static_cast<size_t>(i) % 3] + std::string(i % 2 ? "" : " And"), 2 + i % 7);
    chat_bodies[id] = json::parse(line)["body"];
    content += line + "\n";
    ++chats;
  }
  ASSERT_EQ(chat_bodies.size(), static_cast<size_t>(kChats));
  const json file = body_json(upload(port, content));
  ASSERT_TRUE(file.contains("id")) << file;
  EXPECT_EQ(file["purpose"], "batch");
  EXPECT_EQ(file["bytes"], content.size());
  EXPECT_EQ(body_json(testing::http(port, "GET", "/v1/files/" + file["id"].get<std::string>()))["id"], file["id"]);
  EXPECT_EQ(testing::http_body(testing::http(port, "GET", "/v1/files/" + file["id"].get<std::string>() + "/content")),
            content);

  const json created = create_batch(port, file["id"]);
  EXPECT_EQ(created["status"], "validating");
  EXPECT_EQ(created["request_counts"]["total"], kLines);
  // The online API answers while the batch runs.
  const std::string online = testing::http(port, "POST", "/v1/chat/completions",
                                           json::parse(chat_line("x", prompts[0], 4))["body"].dump());
  ASSERT_EQ(testing::http_status(online), 200) << online;
  const json done = poll_batch(port, created["id"], [](const json& b) { return b["status"] == "completed"; });
  ASSERT_EQ(done["status"], "completed") << done;
  EXPECT_EQ(done["request_counts"]["completed"], kChats);
  EXPECT_EQ(done["request_counts"]["failed"], kLines - kChats);
  EXPECT_GT(done["tessera_progress"]["completion_tokens"].get<int>(), 0);

  const std::vector<json> results =
      jsonl(testing::http_body(testing::http(port, "GET", "/v1/files/" + done["output_file_id"].get<std::string>() + "/content")));
  const std::vector<json> errors =
      jsonl(testing::http_body(testing::http(port, "GET", "/v1/files/" + done["error_file_id"].get<std::string>() + "/content")));
  ASSERT_EQ(results.size(), static_cast<size_t>(kChats));
  ASSERT_EQ(errors.size(), static_cast<size_t>(kLines - kChats));
  std::set<std::string> answered;
  for (const json& r : results) {
    ASSERT_EQ(r["response"]["status_code"], 200) << r;
    const std::string id = r["custom_id"];
    ASSERT_TRUE(chat_bodies.count(id) && answered.insert(id).second) << r;
    // Greedy: what the online API answers to the same body.
    const json batch = r["response"]["body"];
    const json same = body_json(testing::http(port, "POST", "/v1/chat/completions", chat_bodies[id].dump()));
    EXPECT_EQ(batch["choices"][0]["message"], same["choices"][0]["message"]) << id;
    EXPECT_EQ(batch["choices"][0]["finish_reason"], same["choices"][0]["finish_reason"]) << id;
    EXPECT_EQ(batch["usage"], same["usage"]) << id;
  }
  int line_errors = 0, refused = 0;
  for (const json& e : errors) {
    if (e["response"].is_null()) {
      ++line_errors;
      EXPECT_TRUE(e["error"]["code"] == "invalid_json" || e["error"]["code"] == "invalid_url") << e;
    } else {
      ++refused;
      EXPECT_EQ(e["custom_id"].get<std::string>().rfind("refused-", 0), 0u) << e;
      EXPECT_EQ(e["response"]["status_code"], 400) << e;
    }
  }
  EXPECT_EQ(line_errors + refused, kLines - kChats);
  EXPECT_GE(refused, kLines / 100);
  EXPECT_GE(line_errors, kLines / 50);
  const json listed = body_json(testing::http(port, "GET", "/v1/batches"));
  ASSERT_EQ(listed["data"].size(), 1u);
  const std::string cancel = testing::http(port, "POST", "/v1/batches/" + created["id"].get<std::string>() + "/cancel");
  EXPECT_EQ(testing::http_status(cancel), 409) << cancel;
}

TEST(ServeBatches, RefusalsNameWhatIsWrong) {
  TESSERA_REQUIRE_FIXTURES();
  {
    testing::ServeProcess off;
    ASSERT_TRUE(off.start({"--model", batches_model(), "--threads", "1"})) << off.log();
    const std::string r = testing::http(off.port(), "GET", "/v1/batches");
    EXPECT_EQ(testing::http_status(r), 404);
    EXPECT_NE(r.find("server.batch_dir"), std::string::npos) << r;
  }
  const std::string dir = testing::make_temp_dir("tessera-batches-refusals");
  testing::ServeProcess server;
  ASSERT_TRUE(server.start({"--model", batches_model(), "--threads", "1", "--set", "server.batch_dir=" + dir}))
      << server.log();
  const int port = server.port();
  const auto expect = [](const std::string& r, int status, const std::string& words) {
    EXPECT_EQ(testing::http_status(r), status) << r;
    EXPECT_NE(r.find(words), std::string::npos) << r;
  };
  expect(upload(port, "{}\n", "fine-tune"), 400, "'purpose' must be \\\"batch\\\"");
  expect(testing::http(port, "POST", "/v1/files", "{}"), 400, "multipart/form-data");
  expect(testing::http(port, "POST", "/v1/batches", R"({"input_file_id": "file-0000", "endpoint": "/v1/chat/completions"})"),
         404, "no file 'file-0000'");
  const std::string file_id = body_json(upload(port, chat_line("a", "x", 2) + "\n"))["id"];
  expect(testing::http(port, "POST", "/v1/batches", json{{"input_file_id", file_id}, {"endpoint", "/v1/moderations"}}.dump()),
         400, "'endpoint' must be one of");
  expect(testing::http(port, "POST", "/v1/batches",
                       json{{"input_file_id", file_id}, {"endpoint", "/v1/completions"}, {"completion_window", "1h"}}.dump()),
         400, "'completion_window'");
  expect(testing::http(port, "GET", "/v1/batches/batch_nope"), 404, "no batch 'batch_nope'");
  expect(testing::http(port, "GET", "/v1/files/..%2f..%2fetc/content"), 404, "no file");
  expect(testing::http(port, "PUT", "/v1/batches"), 405, "not allowed");
  expect(testing::http(port, "GET", "/v1/batches/x/other"), 404, "no route");
  const std::string deleted = testing::http(port, "DELETE", "/v1/files/" + file_id);
  EXPECT_EQ(body_json(deleted)["deleted"], true) << deleted;
  expect(testing::http(port, "GET", "/v1/files/" + file_id), 404, "no file");
}

// A batch cut by the server going away is never left "in_progress": killed, the next start
// marks it failed (server_restarted); stopped, the server marks it failed itself
// (server_stopped). Either way the results written so far stay, and the counts say how many.
TEST(ServeBatches, ARestartMidBatchIsReportedAsAFailedBatch) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string dir = testing::make_temp_dir("tessera-batches-restart");
  std::string content;
  // The first few end at once (so some results are in soon); the rest outlast the test.
  for (int i = 0; i < 2000; ++i) content += chat_line("r" + std::to_string(i), "In the beginning", i < 8 ? 4 : 200) + "\n";
  for (const int sig : {SIGKILL, SIGTERM}) {
    std::string batch_id;
    {
      testing::ServeProcess server;
      ASSERT_TRUE(server.start({"--model", batches_model(), "--threads", "1", "--set", "server.batch_dir=" + dir}))
          << server.log();
      const json file = body_json(upload(server.port(), content));
      batch_id = create_batch(server.port(), file["id"])["id"];
      const json running = poll_batch(server.port(), batch_id, [](const json& b) {
        return b["status"] == "in_progress" && b["request_counts"]["completed"].get<int>() > 0;
      });
      ASSERT_EQ(running["status"], "in_progress") << running;
      server.signal(sig);
      server.wait_exit(std::chrono::seconds(60));
    }
    testing::ServeProcess again;
    ASSERT_TRUE(again.start({"--model", batches_model(), "--threads", "1", "--set", "server.batch_dir=" + dir}))
        << again.log();
    const json b = body_json(testing::http(again.port(), "GET", "/v1/batches/" + batch_id));
    ASSERT_EQ(b["status"], "failed") << b;
    EXPECT_EQ(b["errors"]["data"][0]["code"], sig == SIGKILL ? "server_restarted" : "server_stopped") << b;
    const int completed = b["request_counts"]["completed"], failed = b["request_counts"]["failed"];
    EXPECT_GT(completed, 0);
    EXPECT_LT(completed + failed, 2000);
    const std::vector<json> results = jsonl(
        testing::http_body(testing::http(again.port(), "GET", "/v1/files/" + b["output_file_id"].get<std::string>() + "/content")));
    EXPECT_EQ(static_cast<int>(results.size()), completed);
    for (const json& r : results) ASSERT_FALSE(r.is_discarded()) << "a whole line each";
  }
}

}  // namespace
}  // namespace tessera
