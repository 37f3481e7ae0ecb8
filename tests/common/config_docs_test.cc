// docs/configuration.md's table of keys is true: every key of the schema has a row, every row
// names a key, and each row's default is what a configuration without that key holds
// (TesseraConfig{} as dump_config_yaml writes it).
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <map>
#include <regex>
#include <sstream>
#include <string>

#include "common/config.h"
#include "tests/test_support.h"

namespace tessera {
namespace {

// key -> its row's default cell, from the "| `key` | type | default | meaning |" rows.
std::map<std::string, std::string> documented_defaults() {
  std::map<std::string, std::string> out;
  std::istringstream in(testing::read_file(testing::source_dir() + "/docs/configuration.md"));
  // Cells are split at " | " (a type like `a` \| `b` escapes its bars).
  const std::regex row(R"(^\| `([a-z0-9_.]+)` \| (.*?[^\\]) \| (.*?[^\\]) \| )");
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_search(line, m, row)) out[m[1]] = m[3];
  }
  return out;
}

YAML::Node value_at(const YAML::Node& root, const std::string& dotted) {
  YAML::Node n = YAML::Clone(root);
  std::stringstream parts(dotted);
  for (std::string p; std::getline(parts, p, '.');) n = YAML::Node(n[p]);
  return n;
}

TEST(ConfigDocs, EveryKeyHasARowAndEveryDefaultIsTrue) {
  const std::map<std::string, std::string> docs = documented_defaults();
  const YAML::Node defaults = YAML::Load(dump_config_yaml(TesseraConfig{}));
  for (const std::string& key : config_key_paths()) {
    auto it = docs.find(key);
    ASSERT_NE(it, docs.end()) << key << " has no row in docs/configuration.md";
    const std::string cell = it->second;
    const YAML::Node v = value_at(defaults, key);
    if (cell == "required") {
      EXPECT_EQ(v.Scalar(), "") << key;
      continue;
    }
    std::smatch m;
    ASSERT_TRUE(std::regex_search(cell, m, std::regex("`([^`]*)`"))) << key << ": default cell '" << cell << "'";
    const std::string doc = m[1];
    if (doc == "[]") {
      EXPECT_TRUE(v.IsSequence() && v.size() == 0) << key;
    } else if (doc == "{}") {
      EXPECT_TRUE((v.IsMap() || v.IsSequence()) && v.size() == 0) << key;
    } else if (doc == "null") {
      EXPECT_TRUE(v.IsNull()) << key;
    } else if (doc == "\"\"") {
      EXPECT_EQ(v.Scalar(), "") << key;
    } else {
      EXPECT_EQ(v.Scalar(), doc) << key << ": docs/configuration.md says " << cell;
    }
  }
  for (const auto& [key, cell] : docs) {
    bool known = false;
    for (const std::string& k : config_key_paths()) known = known || k == key;
    EXPECT_TRUE(known) << "docs/configuration.md documents '" << key << "', which is not a key";
  }
}

}  // namespace
}  // namespace tessera
