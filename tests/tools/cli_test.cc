// tessera-cli against a real tessera-serve (kjv-llama) over loopback: completions and chat,
// streamed and not, over HTTP and over the ZeroMQ client API, must print exactly the greedy
// text tessera-generate produces for the same prompt tokens; errors are one line on stderr
// and exit code 1 (2 for usage errors). Also curl's view of the same event stream.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <nlohmann/json.hpp>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <sstream>

#include "tests/test_support.h"
#include "tests/tools/serve_process.h"

namespace tessera {
namespace {

using nlohmann::json;
using testing::shell_quote;

std::string kjv() { return testing::fixtures_dir() + "/kjv-llama"; }

std::string join_ids(const std::vector<int>& ids) {
  std::string out;
  for (int id : ids) {
    if (!out.empty()) out += ',';
    out += std::to_string(id);
  }
  return out;
}

// Reference: tessera-generate, greedy, on the prompt's token ids.
std::string reference_text(const std::string& text, bool add_special_tokens, int max_new_tokens) {
  auto tok = testing::run_command(testing::bin_dir() + "/tessera-tokenize --tokenizer " + shell_quote(kjv()) +
                                  " --text " + shell_quote(text) + " --json" +
                                  (add_special_tokens ? " --add-special-tokens" : ""));
  EXPECT_EQ(tok.exit_code, 0) << tok.err;
  const std::vector<int> ids = json::parse(tok.out)["ids"];
  auto gen = testing::run_command(testing::bin_dir() + "/tessera-generate --model " + shell_quote(kjv()) +
                                  " --prompt-ids " + join_ids(ids) + " --max-new-tokens " +
                                  std::to_string(max_new_tokens) + " --json");
  EXPECT_EQ(gen.exit_code, 0) << gen.err;
  return json::parse(gen.out)["text"];
}

// tessera-generate's text is decode(output ids), whose Llama decoder drops the first space;
// the API returns the continuation of the prompt, which keeps it.
std::string without_leading_space(std::string text) {
  if (!text.empty() && text[0] == ' ') text.erase(0, 1);
  return text;
}

testing::CommandResult cli(const std::string& args) {
  return testing::run_command(testing::bin_dir() + "/tessera-cli " + args);
}

int lines_of(const std::string& text) { return static_cast<int>(std::count(text.begin(), text.end(), '\n')); }

// A loopback port nobody listens on (bound, then released).
int closed_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

const char* const kPrompt = "And the LORD said unto Moses,";
const char* const kMessage = "Blessed are the";
constexpr int kMaxTokens = 24;

class Cli : public testing::KjvServeSuite {
 protected:
  static std::string url() { return " --url " + server_->url(); }
  static std::string zmq() { return " --zmq " + shell_quote(server_->zmq_endpoint()); }
};

TEST_F(Cli, CompleteOverHttpStreamedAndNotEqualsGenerate) {
  const std::string ref = reference_text(kPrompt, /*add_special_tokens=*/true, kMaxTokens);
  ASSERT_FALSE(ref.empty());
  const std::string flags = " --max-tokens " + std::to_string(kMaxTokens) + " --temperature 0 ";
  for (const std::string mode : {"", " --no-stream"}) {
    auto r = cli("complete" + url() + flags + mode + " " + shell_quote(kPrompt));
    ASSERT_EQ(r.exit_code, 0) << mode << ": " << r.err;
    ASSERT_FALSE(r.out.empty());
    EXPECT_EQ(r.out.back(), '\n');
    EXPECT_EQ(without_leading_space(r.out.substr(0, r.out.size() - 1)), ref) << mode;
    EXPECT_EQ(r.err, "");
  }
  // --json: one object with the text, the finish reason and the usage.
  for (const std::string mode : {"", " --no-stream"}) {
    auto r = cli("complete" + url() + flags + mode + " --json " + shell_quote(kPrompt));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(lines_of(r.out), 1) << r.out;
    const json j = json::parse(r.out);
    EXPECT_EQ(without_leading_space(j["text"]), ref);
    EXPECT_EQ(j["finish_reason"], "length");
    EXPECT_EQ(j["usage"]["completion_tokens"], kMaxTokens);
    EXPECT_EQ(j["usage"]["total_tokens"].get<int>(), j["usage"]["prompt_tokens"].get<int>() + kMaxTokens);
  }
}

TEST_F(Cli, ChatOverHttpEqualsGenerate) {
  // The model's chat template renders "<s>" + the message (special tokens parsed, none added).
  const std::string ref = reference_text(std::string("<s>") + kMessage, /*add_special_tokens=*/false, 16);
  for (const std::string mode : {"", " --no-stream"}) {
    auto r = cli("chat" + url() + " --max-tokens 16 --temperature 0" + mode + " " + shell_quote(kMessage));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    ASSERT_FALSE(r.out.empty());
    EXPECT_EQ(without_leading_space(r.out.substr(0, r.out.size() - 1)), ref) << mode;
  }
  auto r = cli("chat" + url() + " --max-tokens 16 --temperature 0 --json " + shell_quote(kMessage));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(without_leading_space(j["text"]), ref);
  EXPECT_TRUE(j["usage"].is_object()) << r.out;
}

TEST_F(Cli, CompleteAndChatOverZmqEqualGenerate) {
  const std::string ref = reference_text(kPrompt, /*add_special_tokens=*/true, kMaxTokens);
  const std::string flags = " --max-tokens " + std::to_string(kMaxTokens) + " --temperature 0 ";
  for (const std::string mode : {"", " --no-stream"}) {
    auto r = cli("complete" + zmq() + flags + mode + " " + shell_quote(kPrompt));
    ASSERT_EQ(r.exit_code, 0) << mode << ": " << r.err << "\n" << server_->log();
    EXPECT_EQ(without_leading_space(r.out.substr(0, r.out.size() - 1)), ref) << mode;
  }
  auto r = cli("complete" + zmq() + flags + " --json " + shell_quote(kPrompt));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(without_leading_space(j["text"]), ref);
  EXPECT_EQ(j["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], kMaxTokens);

  const std::string chat_ref = reference_text(std::string("<s>") + kMessage, false, 16);
  auto c = cli("chat" + zmq() + " --max-tokens 16 --temperature 0 " + shell_quote(kMessage));
  ASSERT_EQ(c.exit_code, 0) << c.err;
  EXPECT_EQ(without_leading_space(c.out.substr(0, c.out.size() - 1)), chat_ref);

  // A bad field is the server's validation error over ZeroMQ too.
  auto bad = cli("complete" + zmq() + " --temperature -1 x");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("temperature"), std::string::npos) << bad.err;
}

TEST_F(Cli, ModelsAndHealth) {
  auto models = cli("models" + url());
  ASSERT_EQ(models.exit_code, 0) << models.err;
  EXPECT_EQ(models.out, "kjv-llama\n");
  auto health = cli("health" + url());
  ASSERT_EQ(health.exit_code, 0) << health.err;
  EXPECT_EQ(health.out, "ok\n");
  auto raw = cli("--json models" + url());
  ASSERT_EQ(raw.exit_code, 0) << raw.err;
  EXPECT_EQ(json::parse(raw.out)["data"][0]["id"], "kjv-llama");
}

TEST_F(Cli, ErrorsAreOneLineAndExitCodes) {
  // Unreachable server: exit 1, the URL named.
  const std::string dead = "http://127.0.0.1:" + std::to_string(closed_port());
  auto r = cli("complete --url " + dead + " --timeout 5 hello");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find(dead), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("onnection refused"), std::string::npos) << r.err;
  EXPECT_EQ(lines_of(r.err), 1) << r.err;
  EXPECT_EQ(r.out, "");

  // A bad field: the server's 400 message, naming the field.
  for (const std::string flag : {"--temperature -1", "--temperature=-1"}) {
    for (const std::string mode : {"", " --no-stream"}) {
      r = cli("complete" + url() + " " + flag + mode + " hello");
      EXPECT_EQ(r.exit_code, 1) << flag << mode;
      EXPECT_NE(r.err.find(" 400 "), std::string::npos) << r.err;
      EXPECT_NE(r.err.find("temperature"), std::string::npos) << r.err;
      EXPECT_EQ(lines_of(r.err), 1) << r.err;
    }
  }
  r = cli("chat" + url() + " --model no-such-model hello");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("404"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("no-such-model"), std::string::npos) << r.err;

  // Only http:// URLs.
  r = cli("complete --url https://127.0.0.1:" + std::to_string(server_->port()) + " hello");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("https://127.0.0.1"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("http://HOST:PORT"), std::string::npos) << r.err;
  EXPECT_EQ(lines_of(r.err), 1) << r.err;
  r = cli("health --url 127.0.0.1:8000");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("127.0.0.1:8000"), std::string::npos) << r.err;

  // Usage errors: exit 2, one line.
  for (const std::string args : {"complete --bogus x", "complete", "", "chat --max-tokens many x",
                                 "complete --url http://a:1 --zmq tcp://a:2 x", "models --zmq tcp://a:2"}) {
    r = cli(args);
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.err;
    EXPECT_EQ(lines_of(r.err), 1) << args << ": " << r.err;
  }
}

TEST_F(Cli, CurlSeesTheSameEventStreamEndingWithDone) {
  if (testing::run_command("command -v curl").exit_code != 0) {
    GTEST_SKIP() << "SKIPPED: curl is not installed (scripts/install_deps.sh installs it)";
  }
  const std::string ref = reference_text(kPrompt, /*add_special_tokens=*/true, kMaxTokens);
  const json body = {{"prompt", kPrompt}, {"max_tokens", kMaxTokens}, {"temperature", 0}, {"stream", true}};
  auto r = testing::run_command("curl -sN --max-time 120 " + server_->url() +
                                "/v1/completions -H 'Content-Type: application/json' -d " +
                                shell_quote(body.dump()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<std::string> events;
  std::stringstream ss(r.out);
  for (std::string line; std::getline(ss, line);) {
    if (line.empty()) continue;
    ASSERT_EQ(line.rfind("data: ", 0), 0u) << line;
    events.push_back(line.substr(6));
  }
  ASSERT_GE(events.size(), 2u) << r.out;
  EXPECT_EQ(events.back(), "[DONE]");
  EXPECT_EQ(r.out.substr(r.out.size() - 14), "data: [DONE]\n\n");
  std::string text;
  for (size_t i = 0; i + 1 < events.size(); ++i) text += json::parse(events[i])["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(without_leading_space(text), ref);
  EXPECT_EQ(json::parse(events[events.size() - 2])["choices"][0]["finish_reason"], "length");
}

// API keys through the real server: /v1/* needs the bearer key (flag or environment);
// /health stays open. A tiny model keeps this cheap.
TEST(CliAuth, ApiKeyFromFlagOrEnvironment) {
  TESSERA_REQUIRE_FIXTURES();
  testing::ServeProcess server;
  ASSERT_TRUE(server.start({"--model", testing::fixtures_dir() + "/tiny-llama", "--set", "server.http.api_keys=[sekrit]",
                            "--set", "cache.num_blocks=64"}))
      << server.log();
  const std::string url = " --url " + server.url();
  // " 401 ": the status as the message spells it ("HTTP 401 ...", "error 401 ..."), not digits
  // that a port or a temporary folder's name happens to hold.
  auto r = testing::run_command("env -u TESSERA_API_KEY -u OPENAI_API_KEY " + testing::bin_dir() + "/tessera-cli models" + url);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find(" 401 "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("invalid_api_key"), std::string::npos) << r.err;
  r = testing::run_command("env -u TESSERA_API_KEY OPENAI_API_KEY=wrong " + testing::bin_dir() + "/tessera-cli models" + url);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find(" 401 "), std::string::npos) << r.err;
  r = cli("models --api-key sekrit" + url);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "tiny-llama\n");
  r = testing::run_command("TESSERA_API_KEY=sekrit " + testing::bin_dir() + "/tessera-cli models" + url);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = testing::run_command("env -u TESSERA_API_KEY OPENAI_API_KEY=sekrit " + testing::bin_dir() + "/tessera-cli models" + url);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = cli("health" + url);
  EXPECT_EQ(r.exit_code, 0) << r.err;

  // The ZeroMQ client API checks the same keys. (With the key, this text prompt reaches the
  // request validation: tiny-llama has no tokenizer.)
  const std::string zmq = " --zmq " + shell_quote(server.zmq_endpoint()) + " --timeout 30 ";
  r = testing::run_command("env -u TESSERA_API_KEY -u OPENAI_API_KEY " + testing::bin_dir() + "/tessera-cli complete" +
                           zmq + "hello");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find(" 401 "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("invalid_api_key"), std::string::npos) << r.err;
  r = cli("complete --api-key sekrit" + zmq + "hello");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err.find(" 401 "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("tokenizer"), std::string::npos) << r.err;
}

// A reasoning model's thoughts (server.chat_template leaves <think> open, so auto reads think
// tags): kjv-llama never closes them, so every reply is thoughts and no answer — over HTTP and
// ZeroMQ, --json holds them as "reasoning" beside an empty "text"; streamed, they go to stderr
// and stdout holds the (empty) answer alone.
TEST(CliReasoning, ThoughtsAreApartFromTheAnswerOverHttpAndZmq) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string dir = testing::make_temp_dir("cli-reasoning");
  const std::string tmpl = dir + "/think.jinja";
  testing::write_file(tmpl, "{{ bos_token }}{{ messages[-1]['content'] }}\n<think>\n");
  testing::ServeProcess server;
  ASSERT_TRUE(server.start({"--model", testing::fixtures_dir() + "/kjv-llama", "--set", "server.chat_template=" + tmpl,
                            "--set", "cache.num_blocks=64"}))
      << server.log();
  for (const std::string& where : {" --url " + server.url(), " --zmq " + shell_quote(server.zmq_endpoint())}) {
    auto r = cli("chat" + where + " --max-tokens 8 --temperature 0 --json " + shell_quote(kMessage));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json j = json::parse(r.out);
    EXPECT_EQ(j["text"], "") << where << ": " << r.out;
    ASSERT_TRUE(j["reasoning"].is_string()) << where << ": " << r.out;
    EXPECT_FALSE(j["reasoning"].get<std::string>().empty()) << where;
    EXPECT_EQ(j["finish_reason"], "length") << where;
    r = cli("chat" + where + " --max-tokens 8 --temperature 0 " + shell_quote(kMessage));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, "\n") << where;
    EXPECT_EQ(r.err, j["reasoning"].get<std::string>()) << where;
  }
  std::filesystem::remove_all(dir);
}

// server.curve.client_api: the ZeroMQ client API is CURVE-encrypted; tessera-cli gets the
// server's public key from a file, and without it the handshake fails and the error says so.
TEST(CliCurve, ZmqClientApiWithCurveNeedsTheServerKey) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string dir = testing::make_temp_dir("cli-curve");
  std::vector<std::string> args = testing::curve_client_api_args(dir);
  ASSERT_FALSE(args.empty()) << "tessera-curve-keygen failed";
  args.insert(args.end(), {"--model", testing::fixtures_dir() + "/kjv-llama", "--set", "cache.num_blocks=64"});
  testing::ServeProcess server;
  ASSERT_TRUE(server.start(args)) << server.log();
  const std::string zmq = " --zmq " + shell_quote(server.zmq_endpoint());
  auto r = cli("complete" + zmq + " --curve-server-key-file " + dir + "/server.pub --max-tokens 4 --temperature 0 " +
               shell_quote(kPrompt));
  EXPECT_EQ(r.exit_code, 0) << r.err << "\n" << server.log();
  EXPECT_GT(r.out.size(), 1u) << r.out;
  // Without the key the client speaks plain ZMTP to a CURVE server: the handshake fails, and
  // the error says which key is missing (whether it fails before or after the request is sent).
  r = cli("complete" + zmq + " --timeout 30 --max-tokens 4 " + shell_quote(kPrompt));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("handshake"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--curve-server-key-file"), std::string::npos) << r.err;
  // A missing key file is named.
  r = cli("complete" + zmq + " --curve-server-key-file " + dir + "/nope.pub x");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("nope.pub"), std::string::npos) << r.err;
  // The key file means nothing over HTTP: a usage error, not silently ignored.
  r = cli("complete --url " + server.url() + " --curve-server-key-file " + dir + "/server.pub x");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--zmq"), std::string::npos) << r.err;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// tessera-cli embed: the vectors /v1/embeddings returns, over HTTP and ZeroMQ alike (the
// ZeroMQ API cuts and normalises as REST does), one line of numbers per text or --json.
TEST(CliEmbed, TheVectorsOfTheRestApiOverHttpAndZmq) {
  TESSERA_REQUIRE_FIXTURES();
  testing::ServeProcess server;
  ASSERT_TRUE(server.start({"--model", testing::fixtures_dir() + "/kjv-llama", "--dtype", "float32", "--set",
                            "cache.num_blocks=64"}))
      << server.log();
  const json body = {{"input", {"In the beginning", "And God said"}}, {"dimensions", 16}};
  const std::string rest = testing::http(server.port(), "POST", "/v1/embeddings", body.dump());
  ASSERT_EQ(testing::http_status(rest), 200) << rest;
  const json want = json::parse(testing::http_body(rest));
  for (const std::string& where : {" --url " + server.url(), " --zmq " + shell_quote(server.zmq_endpoint())}) {
    auto r = cli("embed" + where + " --dimensions 16 --json 'In the beginning' 'And God said'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json j = json::parse(r.out);
    ASSERT_EQ(j["embeddings"].size(), 2u) << r.out;
    EXPECT_EQ(j["prompt_tokens"], want["usage"]["prompt_tokens"]) << where;
    for (size_t i = 0; i < 2; ++i) {
      ASSERT_EQ(j["embeddings"][i].size(), 16u) << where;
      // (Within float rounding: the two inputs may share a step or not, which moves the last bits.)
      for (size_t k = 0; k < 16; ++k)
        EXPECT_NEAR(j["embeddings"][i][k].get<float>(), want["data"][i]["embedding"][k].get<float>(), 1e-5) << where;
    }
    r = cli("embed" + where + " --dimensions 4 'In the beginning' 'And God said'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::istringstream lines(r.out);
    std::string line;
    int count = 0;
    while (std::getline(lines, line)) {
      std::istringstream values(line);
      double v = 0, sq = 0;
      int n = 0;
      while (values >> v) sq += v * v, ++n;
      EXPECT_EQ(n, 4) << where << ": " << line;
      EXPECT_NEAR(sq, 1.0, 1e-4) << where << ": normalised";
      ++count;
    }
    EXPECT_EQ(count, 2) << where << ": " << r.out;
  }
  auto bad = cli("embed --url " + server.url() + " --model other 'x'");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("model_not_found"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace tessera
