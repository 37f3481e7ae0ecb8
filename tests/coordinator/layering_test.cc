// The coordinator's layers stay layered: a file under coordinator/<layer>/ includes headers of
// its own layer and of the layers below it only, and the engine (which the scheduler and
// engine tests link alone) includes no HTTP, ZeroMQ or template-engine header. The layers and
// what each may include are the table below; coordinator/CMakeLists.txt links them the same way.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "tests/test_support.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

struct LayerRule {
  std::set<std::string> may_include;            // coordinator layers below this one
  std::vector<std::string> forbidden_prefixes;  // include paths this layer must not name
};

// engine: request lifecycle, scheduler, KV blocks, structured-output runtime.
// cluster: the worker processes and their ZeroMQ links. api: the OpenAI layer (Jinja, tool
// calls, grammar compilers). server: HTTP, the ZeroMQ client API, metrics.
const std::map<std::string, LayerRule>& layer_rules() {
  static const std::map<std::string, LayerRule> rules = {
      {"engine", {{}, {"boost/", "zmq", "common/zmq/"}}},
      {"cluster", {{}, {"boost/"}}},
      {"api", {{"engine"}, {"boost/", "zmq", "common/zmq/"}}},
      {"server", {{"engine", "api"}, {}}},
  };
  return rules;
}

// "layer/path: message" for every include of `root`/coordinator that breaks a rule, and for
// every source file outside a layer.
std::vector<std::string> layering_violations(const fs::path& root) {
  std::vector<std::string> out;
  const std::regex include(R"(^\s*#\s*include\s*[<"]([^>"]+)[>"])");
  const fs::path coordinator = root / "coordinator";
  for (const auto& entry : fs::recursive_directory_iterator(coordinator)) {
    const std::string ext = entry.path().extension().string();
    if (!entry.is_regular_file() || (ext != ".h" && ext != ".cc")) continue;
    const fs::path relative = fs::relative(entry.path(), coordinator);
    const std::string layer = relative.begin()->string();
    const auto rule = layer_rules().find(layer);
    if (rule == layer_rules().end()) {
      out.push_back(relative.string() + ": not inside a layer (engine, cluster, api, server)");
      continue;
    }
    std::ifstream in(entry.path());
    for (std::string line; std::getline(in, line);) {
      std::smatch m;
      if (!std::regex_search(line, m, include)) continue;
      const std::string header = m[1];
      for (const std::string& prefix : rule->second.forbidden_prefixes) {
        if (header.rfind(prefix, 0) == 0) out.push_back(relative.string() + ": includes " + header);
      }
      const std::string kPrefix = "coordinator/";
      if (header.rfind(kPrefix, 0) != 0) continue;
      const std::string target = header.substr(kPrefix.size(), header.find('/', kPrefix.size()) - kPrefix.size());
      if (target != layer && rule->second.may_include.count(target) == 0) {
        out.push_back(relative.string() + ": includes " + header + " (" + layer + " may not include " + target + ")");
      }
    }
  }
  return out;
}

TEST(CoordinatorLayering, NoFileIncludesALayerAboveItsOwn) {
  const std::vector<std::string> violations = layering_violations(testing::source_dir());
  std::string listed;
  for (const std::string& v : violations) listed += "\n  " + v;
  EXPECT_TRUE(violations.empty()) << violations.size() << " layering violations:" << listed;
}

// The check itself finds what it is for: a small tree with one file of each kind of mistake.
TEST(CoordinatorLayering, TheCheckFindsUpwardIncludesAndForbiddenHeaders) {
  const fs::path root = fs::temp_directory_path() / ("tessera_layering_" + std::to_string(::getpid()));
  const auto write = [&](const std::string& path, const std::string& text) {
    fs::create_directories((root / path).parent_path());
    std::ofstream(root / path) << text;
  };
  write("coordinator/engine/ok.h", "#include \"coordinator/engine/other.h\"\n#include <vector>\n");
  write("coordinator/engine/up.cc", "#include \"coordinator/api/openai_api.h\"\n");
  write("coordinator/engine/beast.cc", "#include <boost/beast/http.hpp>\n");
  write("coordinator/api/sideways.cc", "#include \"coordinator/cluster/worker_group.h\"\n");
  write("coordinator/server/ok.cc", "#include \"coordinator/api/openai_api.h\"\n#include <zmq.hpp>\n");
  write("coordinator/stray.h", "\n");
  std::vector<std::string> found = layering_violations(root);
  fs::remove_all(root);
  std::sort(found.begin(), found.end());
  ASSERT_EQ(found.size(), 4u) << ::testing::PrintToString(found);
  EXPECT_EQ(found[0], "api/sideways.cc: includes coordinator/cluster/worker_group.h (api may not include cluster)");
  EXPECT_EQ(found[1], "engine/beast.cc: includes boost/beast/http.hpp");
  EXPECT_EQ(found[2], "engine/up.cc: includes coordinator/api/openai_api.h (engine may not include api)");
  EXPECT_EQ(found[3], "stray.h: not inside a layer (engine, cluster, api, server)");
}

}  // namespace
}  // namespace tessera
