#include "common/cgroup_memory.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

namespace tessera {

namespace {

namespace fs = std::filesystem;

// A file's first value as bytes; nullopt for "max", a missing file or anything else.
std::optional<int64_t> read_bytes(const fs::path& file) {
  std::ifstream in(file);
  std::string word;
  if (!(in >> word) || word == "max") return std::nullopt;
  try {
    size_t used = 0;
    const long long v = std::stoll(word, &used);
    if (used != word.size() || v < 0) return std::nullopt;
    return static_cast<int64_t>(v);
  } catch (...) {
    return std::nullopt;
  }
}

// `key`'s value in a memory.stat file (0 when absent).
int64_t stat_value(const fs::path& file, const std::string& key) {
  std::ifstream in(file);
  std::string k;
  int64_t v = 0;
  while (in >> k >> v)
    if (k == key) return v;
  return 0;
}

// The group's folder relative to its hierarchy's mount, from /proc/self/cgroup, and whether
// it is cgroup v2's ("0::/path") rather than v1's memory hierarchy ("N:...memory...:/path").
std::optional<std::pair<fs::path, bool>> group_folder(const std::string& proc_self_cgroup) {
  std::istringstream lines(proc_self_cgroup);
  std::optional<std::pair<fs::path, bool>> v2;
  for (std::string line; std::getline(lines, line);) {
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    const fs::path relative = fs::path(line.substr(b + 1)).relative_path();
    std::istringstream names(controllers);
    bool memory = false;
    for (std::string n; std::getline(names, n, ',');) memory = memory || n == "memory";
    if (memory) return std::make_pair(relative, false);
    if (controllers.empty() && line.rfind("0:", 0) == 0) v2 = std::make_pair(relative, true);
  }
  return v2;
}

// Whole-value numbers past this are "no limit" (v1 writes the page-rounded LONG_MAX).
constexpr int64_t kNoLimit = int64_t{1} << 60;

}  // namespace

std::optional<CgroupMemory> cgroup_memory(const std::string& proc_self_cgroup, const std::string& root) {
  const auto group = group_folder(proc_self_cgroup);
  if (!group) return std::nullopt;
  const auto& [relative, v2] = *group;
  const fs::path top = v2 ? fs::path(root) : fs::path(root) / "memory";
  std::optional<CgroupMemory> tightest;
  // The group, then each ancestor up to the hierarchy's root: the tightest limit holds.
  for (fs::path rel = relative;; rel = rel.parent_path()) {
    const fs::path dir = rel.empty() ? top : top / rel;
    const std::optional<int64_t> limit = read_bytes(dir / (v2 ? "memory.max" : "memory.limit_in_bytes"));
    const std::optional<int64_t> usage = read_bytes(dir / (v2 ? "memory.current" : "memory.usage_in_bytes"));
    if (limit && *limit < kNoLimit && usage) {
      // File pages, active or not, are what the kernel reclaims before it kills anyone (written
      // back first when dirty). Counting the active ones as held (kubelet's working set) made a
      // worker restarted in its container, whose checkpoint's pages the last one had left
      // active, report too little to hold the KV pool it had before.
      const fs::path stat = dir / "memory.stat";
      const int64_t droppable = stat_value(stat, v2 ? "inactive_file" : "total_inactive_file") +
                                stat_value(stat, v2 ? "active_file" : "total_active_file");
      const int64_t held = std::max<int64_t>(0, *usage - droppable);
      const CgroupMemory here{*limit, std::max<int64_t>(0, *limit - held)};
      if (!tightest || here.available_bytes < tightest->available_bytes) tightest = here;
    }
    if (rel.empty()) break;
  }
  return tightest;
}

std::optional<CgroupMemory> this_process_cgroup_memory() {
  std::ifstream in("/proc/self/cgroup");
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  return cgroup_memory(text.str(), "/sys/fs/cgroup");
}

}  // namespace tessera
