// Every command-line program's --help shows each option's default: CLI11's `=VALUE` or a
// "(default: ...)" in its description. The few options listed below have none by nature
// (an input or output that does nothing unless given, a repeatable override).
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/test_support.h"

namespace tessera {
namespace {

// Options that are inputs, outputs or modes chosen by their presence: "absent" is the default.
const std::map<std::string, std::set<std::string>> kNoDefault = {
    {"tessera-generate", {"--prompt", "--prompt-ids", "--prompt-ids-file", "--dump-logits"}},
    {"tessera-tokenize", {"--text", "--text-file", "--decode"}},
    {"tessera-loadgen",
     {"--zmq", "--api-key", "--curve-server-key-file", "--rate", "--sweep", "--concurrency", "--requests",
      "--duration", "--dataset", "--slo", "--json", "--plots", "--compare"}},
    {"tessera-cli", {"--zmq", "--curve-server-key-file"}},
    {"tessera-worker", {"--set"}},
    {"tessera-coordinator", {"--set"}},
    {"tessera-serve", {"--set"}},
};

// The options of one --help text lacking a default: each option's lines are its first line
// ("  --name TYPE...") and the indented description lines after it.
std::vector<std::string> options_without_default(const std::string& help, const std::set<std::string>& exempt) {
  std::vector<std::string> missing;
  std::istringstream in(help);
  std::string line, name, block;
  auto finish = [&] {
    if (name.empty()) return;
    const bool takes_value = std::regex_search(block, std::regex(R"(^\s*\S+ (TEXT|INT|UINT|FLOAT))"));
    const bool has_default = std::regex_search(block, std::regex(R"((TEXT|INT|UINT|FLOAT)\S*=\S|\]=\S)")) ||
                             block.find("default") != std::string::npos;
    if (takes_value && !has_default && block.find("REQUIRED") == std::string::npos && !exempt.count(name)) {
      missing.push_back(name);
    }
    name.clear();
    block.clear();
  };
  const std::regex option(R"(^  (-\w,)?(--[\w-]+))");
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_search(line, m, option)) {
      finish();
      name = m[2];
      if (name == "--help") name.clear();
      block = line;
    } else if (!name.empty() && line.rfind("      ", 0) == 0) {
      block += "\n" + line;
    } else {
      finish();
    }
  }
  finish();
  return missing;
}

TEST(CliHelp, EveryOptionShowsItsDefault) {
  const std::vector<std::pair<std::string, std::string>> programs = {
      {"tessera-serve", ""},          {"tessera-generate", ""},        {"tessera-make-checkpoint", ""},
      {"tessera-tokenize", ""},       {"tessera-worker", ""},          {"tessera-coordinator", ""},
      {"tessera-curve-keygen", ""},   {"tessera-loadgen", ""},         {"tessera-bench", ""},
      {"tessera-cli", ""},            {"tessera-cli", "complete"},     {"tessera-cli", "chat"},
      {"tessera-perplexity", ""},
  };
  for (const auto& [program, sub] : programs) {
    if (program == "tessera-bench" && !TESSERA_HAS_BENCH) {
      std::printf("tessera-bench not built here (TESSERA_BUILD_BENCH=OFF): its --help is not checked\n");
      continue;
    }
    const std::string cmd = testing::bin_dir() + "/" + program + (sub.empty() ? "" : " " + sub) + " --help";
    const testing::CommandResult r = testing::run_command(cmd);
    ASSERT_EQ(r.exit_code, 0) << cmd << "\n" << r.err;
    ASSERT_NE(r.out.find("--help"), std::string::npos) << cmd;
    const auto exempt = kNoDefault.count(program) ? kNoDefault.at(program) : std::set<std::string>{};
    const std::vector<std::string> missing = options_without_default(r.out, exempt);
    std::string names;
    for (const std::string& n : missing) names += " " + n;
    EXPECT_TRUE(missing.empty()) << cmd << ": no default shown for" << names << "\n" << r.out;
  }
}

TEST(CliHelp, TheCheckSeesAMissingDefault) {
  const std::string help =
      "Options:\n  -h,--help                   Print this help message and exit\n"
      "  --shown INT=3               a value\n  --said TEXT                 a value (default: x)\n"
      "  --wrapped TEXT              a long\n                              text (default: y)\n"
      "  --flag                      a switch\n  --bare INT                  a value\n";
  EXPECT_EQ(options_without_default(help, {}), std::vector<std::string>{"--bare"});
}

}  // namespace
}  // namespace tessera
