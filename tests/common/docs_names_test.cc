// The names a user types or reads from docs/ and README.md are the code's names, both ways:
// environment variables, Prometheus metrics and the programs' command-line flags. A name the
// docs give that the code lacks is a broken promise; one the code has that no page names is a
// hidden feature. (Configuration keys: config_docs_test.cc.)
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/test_support.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

// Every user-facing page: docs/*.md and the README.
std::map<std::string, std::string> user_docs() {
  std::map<std::string, std::string> pages;
  const std::string root = testing::source_dir();
  pages["README.md"] = testing::read_file(root + "/README.md");
  for (const auto& entry : fs::directory_iterator(root + "/docs")) {
    if (entry.path().extension() == ".md") pages["docs/" + entry.path().filename().string()] = testing::read_file(entry.path());
  }
  return pages;
}

// The product's sources (what users run), by path relative to the repository.
std::map<std::string, std::string> product_sources() {
  std::map<std::string, std::string> files;
  const std::string root = testing::source_dir();
  for (const char* dir : {"common", "kernels", "worker", "coordinator", "tools", "bench"}) {
    for (const auto& entry : fs::recursive_directory_iterator(root + "/" + dir)) {
      const std::string ext = entry.path().extension().string();
      if (!entry.is_regular_file() || (ext != ".cc" && ext != ".h" && ext != ".cu" && ext != ".cuh")) continue;
      files[fs::relative(entry.path(), root).string()] = testing::read_file(entry.path());
    }
  }
  return files;
}

std::set<std::string> matches(const std::string& text, const std::regex& pattern, int group = 0) {
  std::set<std::string> out;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), pattern); it != std::sregex_iterator(); ++it) {
    out.insert((*it)[group]);
  }
  return out;
}

std::set<std::string> matches_in(const std::map<std::string, std::string>& files, const std::regex& pattern,
                                 int group = 0) {
  std::set<std::string> out;
  for (const auto& [path, text] : files) out.merge(matches(text, pattern, group));
  return out;
}

bool mentioned(const std::map<std::string, std::string>& files, const std::string& name) {
  for (const auto& [path, text] : files) {
    if (text.find(name) != std::string::npos) return true;
  }
  return false;
}

// "a, b, c".
std::string listed(const std::set<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// Environment variables: every TESSERA_* name in a string literal of the product is read
// from the environment somewhere (getenv, the pod identity, the kernel switches) and must be
// documented; every TESSERA_* name the docs give must be a name the code has (an
// environment variable, a CMake option or a macro: any mention in a source, test, build or
// script file counts).
TEST(DocsNames, EnvironmentVariables) {
  const auto docs = user_docs();
  const auto sources = product_sources();
  const std::set<std::string> read_by_code = matches_in(sources, std::regex("\"(TESSERA_[A-Z0-9_]+)\""), 1);
  ASSERT_GE(read_by_code.size(), 8u) << "the scan found too few names to be looking in the right place";
  std::set<std::string> undocumented;
  for (const std::string& name : read_by_code) {
    bool found = false;
    for (const auto& [page, text] : docs) found = found || std::regex_search(text, std::regex("\\b" + name + "\\b"));
    if (!found) undocumented.insert(name);
  }
  EXPECT_TRUE(undocumented.empty()) << "read by the code, named in no page of docs/ or README.md: " << listed(undocumented);

  std::map<std::string, std::string> everything = sources;
  const std::string root = testing::source_dir();
  for (const auto& entry : fs::recursive_directory_iterator(root + "/tests")) {
    const std::string ext = entry.path().extension().string();
    if (entry.is_regular_file() && (ext == ".cc" || ext == ".h")) everything[entry.path().string()] = testing::read_file(entry.path());
  }
  for (const char* path : {"CMakeLists.txt", "tests/CMakeLists.txt", "tests/fuzz/CMakeLists.txt", "scripts/install_deps.sh",
                           "scripts/fuzz.sh", ".ci/run"}) {
    everything[path] = testing::read_file(root + "/" + path);
  }
  std::set<std::string> unknown;
  for (const std::string& name : matches_in(docs, std::regex("\\bTESSERA_[A-Z0-9_]*[A-Z0-9]\\b"))) {
    if (!mentioned(everything, name)) unknown.insert(name);
  }
  EXPECT_TRUE(unknown.empty()) << "named in docs, unknown to the code: " << listed(unknown);
}

// Metrics: /metrics serves exactly the names docs/api.md lists. A histogram's _bucket, _sum
// and _count series are named by the histogram.
TEST(DocsNames, Metrics) {
  const auto docs = user_docs();
  const std::string metrics_cc = testing::read_file(testing::source_dir() + "/coordinator/server/metrics.cc");
  const std::regex metric_name(R"(\b((?:vllm|tessera):[a-z_][a-z0-9_]*[a-z0-9]))");
  const std::set<std::string> served = matches(metrics_cc, metric_name, 1);
  ASSERT_GE(served.size(), 10u);
  std::set<std::string> undocumented;
  for (const std::string& name : served) {
    if (!mentioned(docs, name)) undocumented.insert(name);
  }
  EXPECT_TRUE(undocumented.empty()) << "served at /metrics, named in no page: " << listed(undocumented);

  std::set<std::string> unknown;
  for (std::string name : matches_in(docs, metric_name, 1)) {
    for (const char* series : {"_bucket", "_sum", "_count"}) {
      const std::string s = series;
      if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0 &&
          served.count(name.substr(0, name.size() - s.size())) > 0) {
        name.resize(name.size() - s.size());
      }
    }
    if (served.count(name) == 0) unknown.insert(name);
  }
  EXPECT_TRUE(unknown.empty()) << "named in docs, not served: " << listed(unknown);
}

// The long flags each program declares (CLI11 add_option / add_flag), by program name.
std::map<std::string, std::set<std::string>> declared_flags() {
  std::map<std::string, std::set<std::string>> out;
  const std::regex declaration(R"re(add_(?:option|flag)\("([^"]+)")re");
  const std::regex long_flag("--[a-z0-9][a-z0-9-]*");
  for (const auto& [path, text] : product_sources()) {
    const fs::path p(path);
    if (p.extension() != ".cc" || text.find("CLI::App") == std::string::npos) continue;
    // The binaries are tessera-<name> for tools/tessera_<name>.cc and bench/tessera_bench.cc,
    // and the file's stem for the other benchmark programs (batching_bench).
    std::string program = p.stem().string();
    if (program.rfind("tessera_", 0) == 0) {
      for (char& c : program) c = c == '_' ? '-' : c;
    }
    for (const std::string& names : matches(text, declaration, 1)) out[program].merge(matches(names, long_flag));
  }
  // Flags several programs share are declared once in tools/lib/<name>_flags.cc by
  // add_<name>_flags(app, ...): each program calling it declares them too.
  const std::regex shared_call(R"re(\badd_([a-z_]+)_flags\()re");
  for (const auto& [path, text] : product_sources()) {
    const fs::path p(path);
    std::string program = p.stem().string();
    if (p.extension() != ".cc" || program.rfind("tessera_", 0) != 0) continue;
    for (char& c : program) c = c == '_' ? '-' : c;
    for (const std::string& lib : matches(text, shared_call, 1)) {
      const auto shared = out.find(lib + "_flags");
      if (shared != out.end()) out[program].insert(shared->second.begin(), shared->second.end());
    }
  }
  return out;
}

// The command lines the docs show for one of the programs: inline code spans and lines of
// code blocks (with their backslash continuations) that start with the program's name,
// optionally behind build/bin/. Returns program -> the flags used with it.
std::map<std::string, std::set<std::string>> documented_command_flags(std::string text) {
  text = std::regex_replace(text, std::regex("\\\\\n"), " ");  // continuation lines joined
  std::map<std::string, std::set<std::string>> out;
  const std::regex command(R"((?:^|[`\s(])(?:build/bin/)?(tessera-[a-z-]*[a-z]|batching_bench)\b([^`\n]*))");
  const std::regex long_flag("(?:^|\\s)(--[a-z0-9][a-z0-9-]*)");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), command); it != std::sregex_iterator(); ++it) {
    out[(*it)[1]].merge(matches((*it)[2].str(), long_flag, 1));
  }
  return out;
}

// Command-line flags: each flag a page shows on a program's command line is one that program
// declares, and every flag a program declares is named somewhere in the docs. (A tessera-*
// word that is no program, e.g. a Kubernetes Secret's name, is not a command line.)
TEST(DocsNames, CommandLineFlags) {
  const auto docs = user_docs();
  const auto declared = declared_flags();
  ASSERT_GE(declared.size(), 8u) << "found the flags of too few programs";
  ASSERT_TRUE(declared.count("tessera-serve") && declared.at("tessera-serve").count("--model"));
  std::set<std::string> unknown;
  for (const auto& [page, text] : docs) {
    for (const auto& [program, flags] : documented_command_flags(text)) {
      const auto it = declared.find(program);
      if (it == declared.end()) continue;
      for (const std::string& flag : flags) {
        if (flag == "--help" || flag == "--version") continue;  // CLI11's own
        if (it->second.count(flag) == 0) unknown.insert(page + ": " + program + " " + flag);
      }
    }
  }
  EXPECT_TRUE(unknown.empty()) << "flags shown in docs that the program does not declare: " << listed(unknown);

  std::set<std::string> undocumented;
  for (const auto& [program, flags] : declared) {
    for (const std::string& flag : flags) {
      bool found = false;
      for (const auto& [page, text] : docs) found = found || std::regex_search(text, std::regex(flag + "(?![a-z0-9-])"));
      if (!found) undocumented.insert(program + " " + flag);
    }
  }
  EXPECT_TRUE(undocumented.empty()) << "flags no page of docs/ or README.md names: " << listed(undocumented);
}

// Request fields: every field the OpenAI layer implements (kImplemented in
// coordinator/api/api_request_fields.cc, read from its source) is named in docs/api.md, in
// backquotes as the page writes field names.
TEST(DocsNames, RequestFields) {
  const std::string source = testing::read_file(testing::source_dir() + "/coordinator/api/api_request_fields.cc");
  const size_t table = source.find("constexpr Field kImplemented[]");
  ASSERT_NE(table, std::string::npos) << "the implemented-fields table moved";
  const size_t end = source.find("};", table);
  const std::string entries = source.substr(table, end - table);
  const std::regex entry(R"re(\{"([a-z_]+)", k(Both|Chat|Completions)\})re");
  const std::string api = testing::read_file(testing::source_dir() + "/docs/api.md");
  std::set<std::string> found, undocumented;
  for (auto it = std::sregex_iterator(entries.begin(), entries.end(), entry); it != std::sregex_iterator(); ++it) {
    const std::string name = (*it)[1];
    found.insert(name);
    // (An object field may be named by its members: `stream_options.include_usage`.)
    if (api.find("`" + name + "`") == std::string::npos && api.find("`" + name + ".") == std::string::npos)
      undocumented.insert(name);
  }
  EXPECT_GE(found.size(), 40u) << "found too few fields: " << listed(found);
  EXPECT_TRUE(found.count("chat_template_kwargs") && found.count("include_reasoning")) << listed(found);
  EXPECT_TRUE(undocumented.empty()) << "request fields docs/api.md never names: " << listed(undocumented);

  // /v1/embeddings reads its own fields (kFields in coordinator/api/embeddings_request.cc).
  const std::string embeddings = testing::read_file(testing::source_dir() + "/coordinator/api/embeddings_request.cc");
  const size_t list = embeddings.find("kFields = {");
  ASSERT_NE(list, std::string::npos) << "the embeddings fields list moved";
  const std::string names = embeddings.substr(list, embeddings.find("};", list) - list);
  const std::regex quoted("\"([a-z_]+)\"");
  std::set<std::string> embedding_fields, embedding_undocumented;
  for (auto it = std::sregex_iterator(names.begin(), names.end(), quoted); it != std::sregex_iterator(); ++it) {
    embedding_fields.insert((*it)[1]);
    if (api.find("`" + (*it)[1].str() + "`") == std::string::npos) embedding_undocumented.insert((*it)[1]);
  }
  EXPECT_TRUE(embedding_fields.count("input") && embedding_fields.count("dimensions")) << listed(embedding_fields);
  EXPECT_TRUE(embedding_undocumented.empty()) << "embeddings fields docs/api.md never names: "
                                              << listed(embedding_undocumented);

  // /v1/responses likewise (kFields in coordinator/api/responses_api.cc).
  const std::string responses = testing::read_file(testing::source_dir() + "/coordinator/api/responses_api.cc");
  const size_t rlist = responses.find("kFields = {");
  ASSERT_NE(rlist, std::string::npos) << "the responses fields list moved";
  const std::string rnames = responses.substr(rlist, responses.find("};", rlist) - rlist);
  std::set<std::string> response_fields, response_undocumented;
  for (auto it = std::sregex_iterator(rnames.begin(), rnames.end(), quoted); it != std::sregex_iterator(); ++it) {
    response_fields.insert((*it)[1]);
    if (api.find("`" + (*it)[1].str() + "`") == std::string::npos) response_undocumented.insert((*it)[1]);
  }
  EXPECT_TRUE(response_fields.count("previous_response_id") && response_fields.count("instructions"))
      << listed(response_fields);
  EXPECT_TRUE(response_undocumented.empty()) << "responses fields docs/api.md never names: "
                                             << listed(response_undocumented);
}

// The scanners above find what they are for, on text written here.
TEST(DocsNames, TheScannersFindNamesInCommandsAndCode) {
  const auto flags = documented_command_flags(
      "Run `build/bin/tessera-serve --model M --port 0` or\n```\ntessera-bench --batch 8 \\\n  --json\n```\n"
      "and cmake --build build (not a program of ours).");
  ASSERT_EQ(flags.size(), 2u);
  EXPECT_EQ(flags.at("tessera-serve"), (std::set<std::string>{"--model", "--port"}));
  EXPECT_EQ(flags.at("tessera-bench"), (std::set<std::string>{"--batch", "--json"}));
  EXPECT_EQ(matches("a \"TESSERA_X\" and TESSERA_Y", std::regex("\"(TESSERA_[A-Z0-9_]+)\""), 1),
            (std::set<std::string>{"TESSERA_X"}));
}

}  // namespace
}  // namespace tessera
