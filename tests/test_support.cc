#include "tests/test_support.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

namespace tessera::testing {

std::string fixtures_dir() {
  const char* env = std::getenv("TESSERA_FIXTURES");
  std::string dir = env ? env : TESSERA_FIXTURES_DIR;
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return "";
  return std::filesystem::canonical(dir, ec).string();
}

std::vector<std::string> tiny_models() {
  std::set<std::string> names = {"tiny-bloom",      "tiny-llama",  "tiny-mixtral",   "tiny-llama3", "tiny-mistral-swa",
                                 "tiny-qwen2",      "tiny-qwen3",  "tiny-qwen3-moe", "tiny-qwen2-moe", "tiny-phi3",
                                 "tiny-gemma2",     "tiny-gemma3", "tiny-falcon",    "tiny-gpt-neox",  "tiny-gpt2",
                                 "tiny-starcoder2"};
  const std::string dir = fixtures_dir();
  std::error_code ec;
  if (!dir.empty()) {
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("tiny-", 0) == 0 && std::filesystem::exists(e.path() / "goldens" / "index.json")) names.insert(name);
    }
  }
  return {names.begin(), names.end()};
}

float top2_margin(const float* row, int64_t vocab) {
  float a = -INFINITY, b = -INFINITY;
  for (int64_t i = 0; i < vocab; ++i) {
    if (row[i] > a) {
      b = a;
      a = row[i];
    } else if (row[i] > b) {
      b = row[i];
    }
  }
  return a - b;
}

std::vector<std::string> golden_models() {
  std::vector<std::string> out = tiny_models();
  out.push_back("kjv-llama");
  return out;
}

std::string bin_dir() { return TESSERA_BIN_DIR; }
std::string source_dir() { return TESSERA_SOURCE_DIR; }

namespace {

// Temporary folders the tests made, removed when the test program exits (by the process that
// made them: a forked child that exits must not remove its parent's).
struct TempDirs {
  std::mutex mu;
  std::vector<std::pair<pid_t, std::string>> dirs;
  static TempDirs& get() {
    static TempDirs* d = [] {
      auto* t = new TempDirs();  // never destroyed: the exit handler reads it
      std::atexit([] {
        TempDirs& all = get();
        std::lock_guard<std::mutex> lock(all.mu);
        for (const auto& [pid, dir] : all.dirs) {
          std::error_code ec;
          if (pid == ::getpid()) std::filesystem::remove_all(dir, ec);
        }
      });
      return t;
    }();
    return *d;
  }
};

}  // namespace

std::string make_temp_dir(const std::string& prefix) {
  std::random_device rd;
  auto base = std::filesystem::temp_directory_path();
  for (int attempt = 0; attempt < 100; ++attempt) {
    auto dir = base / (prefix + "-" + std::to_string(rd()));
    if (std::filesystem::create_directory(dir)) {
      TempDirs& all = TempDirs::get();
      std::lock_guard<std::mutex> lock(all.mu);
      all.dirs.emplace_back(::getpid(), dir.string());
      return dir.string();
    }
  }
  ADD_FAILURE() << "could not create a temp dir";
  return base.string();
}

std::string ranks_apart_bin_dir(const std::string& program, std::string* why_not) {
  const CommandResult probe =
      run_command("unshare --mount /bin/sh -c 'mount -t tmpfs -o size=1m tmpfs /dev/shm' 2>&1");
  if (probe.exit_code != 0) {
    *why_not = "cannot give a process a /dev/shm of its own (unshare --mount; mount): " + probe.out + probe.err;
    return "";
  }
  // Beside bin_dir() (a hard link stays on its file system), one folder per test program.
  const std::string dir = bin_dir() + "/../ranks-apart-" + std::to_string(::getpid());
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  {
    TempDirs& all = TempDirs::get();
    std::lock_guard<std::mutex> lock(all.mu);
    all.dirs.emplace_back(::getpid(), dir);
  }
  std::filesystem::remove(dir + "/" + program, ec);
  std::filesystem::create_hard_link(bin_dir() + "/" + program, dir + "/" + program, ec);
  if (ec) {
    *why_not = "cannot link " + program + " into " + dir + ": " + ec.message();
    return "";
  }
  std::string worker = "'";
  for (char c : bin_dir() + "/tessera-worker") worker += c == '\'' ? std::string("'\\''") : std::string(1, c);
  worker += "'";
  // The pid stays the worker's (exec all the way), so the launcher's signals reach it.
  write_file(dir + "/tessera-worker",
             "#!/bin/sh\n"
             "exec unshare --mount /bin/sh -c 'mount -t tmpfs -o size=64m tmpfs /dev/shm && exec \"$0\" \"$@\"' " +
                 worker + " \"$@\"\n");
  std::filesystem::permissions(dir + "/tessera-worker", std::filesystem::perms::owner_all, ec);
  return dir;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<float> read_f32_file(const std::string& path) {
  std::string bytes = read_file(path);
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
  return out;
}

void write_file(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary);
  out << contents;
}

CommandResult run_command(const std::string& command) {
  std::string dir = make_temp_dir("tessera-cmd");
  std::string out_path = dir + "/out", err_path = dir + "/err";
  std::string full = command + " >" + out_path + " 2>" + err_path;
  int status = std::system(full.c_str());
  CommandResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = read_file(out_path);
  r.err = read_file(err_path);
  std::filesystem::remove_all(dir);
  return r;
}

}  // namespace tessera::testing
