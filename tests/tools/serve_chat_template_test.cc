// No silent fallback: tessera-serve on a model whose tokenizer_config.json has a chat template
// that does not parse exits non-zero before any worker starts, with one line naming the
// construct and its line (it used to log a warning and join message contents).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/test_support.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

// kjv-llama (which has a tokenizer) with tokenizer_config.json's chat_template replaced.
std::string model_with_template(const std::string& dir, const std::string& chat_template) {
  const std::string src = testing::fixtures_dir() + "/kjv-llama";
  const std::string model = dir + "/kjv-llama";
  fs::create_directories(model);
  for (const auto& entry : fs::directory_iterator(src)) {
    if (entry.path().filename() == "tokenizer_config.json") continue;
    fs::create_symlink(entry.path(), model + "/" + entry.path().filename().string());
  }
  nlohmann::ordered_json config = nlohmann::ordered_json::parse(testing::read_file(src + "/tokenizer_config.json"));
  config["chat_template"] = chat_template;
  testing::write_file(model + "/tokenizer_config.json", config.dump(2));
  return model;
}

struct BadTemplate {
  std::string name, source, needle;
};

TEST(ServeChatTemplate, TemplateThatDoesNotParseStopsStartUpWithOneLine) {
  TESSERA_REQUIRE_FIXTURES();
  for (const BadTemplate& b : std::vector<BadTemplate>{
           {"unclosed_if", "{{ bos_token }}\n{% for m in messages %}\n{% if m.role == 'user' %}{{ m.content }}\n{% endfor %}",
            "line 4: unexpected {% endfor %}"},
           {"unknown_filter", "{% for m in messages %}\n\n{{ m.content | shout }}{% endfor %}", "line 3: no filter named 'shout'"},
           {"include", "{% include 'other.jinja' %}", "line 1: {% include %} is not supported"}}) {
    const std::string dir = testing::make_temp_dir("tessera-bad-template");
    const std::string model = model_with_template(dir, b.source);
    const auto r = testing::run_command(testing::bin_dir() + "/tessera-serve --model '" + model +
                                        "' --port 0 --set worker.backend=cpu");
    fs::remove_all(dir);
    EXPECT_NE(r.exit_code, 0) << b.name << ": " << r.err;
    EXPECT_LT(r.exit_code, 128) << b.name << " killed by a signal: " << r.err;
    EXPECT_NE(r.err.find(b.needle), std::string::npos) << b.name << " stderr: " << r.err;
    EXPECT_NE(r.err.find("chat template"), std::string::npos) << b.name << " stderr: " << r.err;
    // One error line (the set-up log lines before it are info lines), and it names it all.
    std::vector<std::string> errors;
    for (size_t at = 0; at < r.err.size();) {
      const size_t end = std::min(r.err.find('\n', at), r.err.size());
      const std::string line = r.err.substr(at, end - at);
      if (line.find(" info ") == std::string::npos) errors.push_back(line);
      at = end + 1;
    }
    ASSERT_EQ(errors.size(), 1u) << b.name << " stderr: " << r.err;
    EXPECT_EQ(errors[0].rfind("tessera-serve: ", 0), 0u) << errors[0];
    EXPECT_NE(errors[0].find(b.needle), std::string::npos) << errors[0];
  }
}

// The error lines of a run's stderr (the set-up's info lines aside).
std::vector<std::string> error_lines(const std::string& err) {
  std::vector<std::string> errors;
  for (size_t at = 0; at < err.size();) {
    const size_t end = std::min(err.find('\n', at), err.size());
    const std::string line = err.substr(at, end - at);
    if (!line.empty() && line.find(" info ") == std::string::npos) errors.push_back(line);
    at = end + 1;
  }
  return errors;
}

// server.chat_template: a missing file, a name that is no built-in, an empty file and a file
// that does not parse each stop start-up with one line naming the key (no fallback);
// server.tool_call_parser refuses an unknown parser by name.
TEST(ServeChatTemplate, ConfiguredTemplateThatCannotBeUsedStopsStartUp) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string dir = testing::make_temp_dir("tessera-template-setting");
  testing::write_file(dir + "/bad.jinja", "{% for m in messages %}\n{{ m.content }\n{% endfor %}");
  testing::write_file(dir + "/empty.jinja", "");
  const std::string model = testing::fixtures_dir() + "/kjv-llama";
  struct Case {
    std::string set, needle;
  };
  for (const Case& c : std::vector<Case>{
           {"server.chat_template=" + dir + "/missing.jinja", "is neither a built-in template (llama2, chatml) nor a readable file"},
           {"server.chat_template=vicuna", "'vicuna' is neither a built-in template"},
           {"server.chat_template=" + dir + "/empty.jinja", "the file is empty"},
           {"server.chat_template=" + dir + "/bad.jinja", "line 2"},
           {"server.tool_call_parser=hermes2", "server.tool_call_parser"}}) {
    const auto r = testing::run_command(testing::bin_dir() + "/tessera-serve --model '" + model +
                                        "' --port 0 --set worker.backend=cpu --set '" + c.set + "'");
    EXPECT_NE(r.exit_code, 0) << c.set << ": " << r.err;
    EXPECT_LT(r.exit_code, 128) << c.set << " killed by a signal: " << r.err;
    const std::vector<std::string> errors = error_lines(r.err);
    ASSERT_EQ(errors.size(), 1u) << c.set << " stderr: " << r.err;
    EXPECT_NE(errors[0].find(c.needle), std::string::npos) << c.set << ": " << errors[0];
    if (c.set.starts_with("server.chat_template")) {
      EXPECT_NE(errors[0].find("server.chat_template"), std::string::npos) << errors[0];
    }
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tessera
