// The chat template corpus (fixtures/chat_templates, README section 7): 24 real models'
// templates x 6 conversations, rendered as transformers' apply_chat_template renders them.
// Every `ok` case must match the reference byte for byte; every `error` case must be
// refused (InvalidArgument), with the template's own message where it raised one.
#include <filesystem>
#include <iostream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "coordinator/api/chat_template.h"
#include "tests/test_support.h"

namespace tessera {
namespace {

using nlohmann::ordered_json;

// The parts' texts joined with no separator (the corpus's "joined-text" variant).
ordered_json join_parts(ordered_json messages) {
  for (ordered_json& m : messages) {
    if (!m["content"].is_array()) continue;
    std::string text;
    for (const ordered_json& p : m["content"])
      if (p.value("type", "") == "text") text += p.value("text", "");
    m["content"] = text;
  }
  return messages;
}

TEST(ChatTemplateCorpusTest, EveryReferenceCase) {
  TESSERA_REQUIRE_FIXTURES();
  const std::string dir = testing::fixtures_dir() + "/chat_templates";
  if (!std::filesystem::exists(dir + "/expected/index.json")) GTEST_SKIP() << "SKIPPED: " << dir << " not found";
  const ordered_json conversations = ordered_json::parse(testing::read_file(dir + "/conversations.json"));
  const ordered_json index = ordered_json::parse(testing::read_file(dir + "/expected/index.json"));
  std::tm pinned{};  // strftime_now is pinned to Friday 26 July 2024 in the reference
  pinned.tm_year = 2024 - 1900;
  pinned.tm_mon = 6;
  pinned.tm_mday = 26;
  pinned.tm_wday = 5;
  pinned.tm_yday = 207;
  int ok_total = 0, ok_exact = 0, error_total = 0, error_refused = 0;
  for (const ordered_json& c : index) {
    const std::string status = c["status"];
    if (status != "ok" && status != "error") continue;
    const ordered_json t = ordered_json::parse(testing::read_file(dir + "/templates/" + c["template"].get<std::string>() + ".json"));
    ordered_json conv;
    for (const ordered_json& cv : conversations)
      if (cv["id"] == c["conversation"]) conv = cv;
    ASSERT_FALSE(conv.is_null()) << c["case"];
    auto tmpl = ChatTemplate::parse(t["template"].get<std::string>());
    ASSERT_TRUE(tmpl.is_ok()) << c["case"] << ": " << tmpl.status().to_string();
    tmpl->set_special_tokens(std::nullopt, std::nullopt);
    jinja::RenderLimits limits;
    limits.fixed_now = pinned;
    tmpl->set_limits(limits);
    const bool joined = c["variant"].get<std::string>().rfind("joined-text", 0) == 0;
    ordered_json ctx = {{"messages", joined ? join_parts(conv["messages"]) : conv["messages"]},
                {"tools", conv.contains("tools") ? conv["tools"] : ordered_json(nullptr)},
                {"documents", nullptr},
                {"add_generation_prompt", true}};
    if (!t["bos_token"].is_null()) ctx["bos_token"] = t["bos_token"];
    if (!t["eos_token"].is_null()) ctx["eos_token"] = t["eos_token"];
    StatusOr<std::string> out = tmpl->render(ctx);
    const std::string name = c["case"];
    if (status == "ok") {
      ++ok_total;
      const std::string want = testing::read_file(dir + "/expected/" + name + ".txt");
      EXPECT_TRUE(out.is_ok()) << name << ": " << out.status().to_string();
      if (!out.is_ok()) continue;
      EXPECT_EQ(out.value(), want) << name;
      ok_exact += out.value() == want;
    } else {
      ++error_total;
      EXPECT_FALSE(out.is_ok()) << name << " rendered " << (out.is_ok() ? out.value() : "");
      if (out.is_ok()) continue;
      EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument) << name;
      // The reference's own message where the template raised one; otherwise a type error
      // worded as Python's (the reference's wording is its JavaScript engine's).
      const std::string ref = c["message"];
      const std::string prefix = "raise_exception: ";
      if (ref.rfind(prefix, 0) == 0) {
        EXPECT_EQ(out.status().message(), ref.substr(prefix.size())) << name;
        error_refused += out.status().message() == ref.substr(prefix.size());
      } else {
        ++error_refused;
      }
    }
  }
  std::cout << "chat template corpus: " << ok_exact << "/" << ok_total << " ok cases byte-exact, " << error_refused
            << "/" << error_total << " error cases refused\n";
  EXPECT_EQ(ok_exact, ok_total);
  EXPECT_EQ(error_refused, error_total);
}

}  // namespace
}  // namespace tessera
