#pragma once
// Shared helpers for tests: where the reference fixtures and built programs live, and
// running a real program to check its output and exit code.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::testing {

// ../shared/fixtures (or $TESSERA_FIXTURES); empty when it does not exist.
std::string fixtures_dir();
// The fixture models with goldens/: every tiny-<family> folder found in fixtures_dir()
// (so a new fixture is tested without a code change) plus kjv-llama; the names known when
// this was written are listed even without the fixtures, so their tests skip visibly.
std::vector<std::string> golden_models();
// Just the tiny-<family> random-weight models of golden_models().
std::vector<std::string> tiny_models();
// Top-1 minus top-2 of one logits row: how much error the row tolerates before its greedy
// choice may legitimately flip.
float top2_margin(const float* row, int64_t vocab);
// build/bin, where the command-line programs are.
std::string bin_dir();
std::string source_dir();
// A fresh empty directory under the system temp dir; removed when the test program exits (the
// caller may remove it sooner).
std::string make_temp_dir(const std::string& prefix);
// A folder holding `program` (hard-linked from bin_dir(), so that it finds its workers beside
// it) and a tessera-worker that starts the real one in a mount namespace of its own with a
// /dev/shm of its own, as a pod on another host has: the ranks `program` starts from there
// share no shared memory (worker.collectives auto picks Gloo), though they share the network.
// Removed when the test program exits. Empty, with the reason in `why_not`, where this
// process may not make mount namespaces (it needs root, or unshare and mount from util-linux).
std::string ranks_apart_bin_dir(const std::string& program, std::string* why_not);

// True in the sanitized build (CI's second tree, configured with TESSERA_SANITIZE or
// TESSERA_FUZZ: AddressSanitizer + UndefinedBehaviorSanitizer).
inline constexpr bool kSanitizedBuild =
#if defined(TESSERA_SANITIZED)
    true;
#else
    false;
#endif

// How many times slower than a plain optimized build this one runs: 5 under the sanitizers,
// else 1. Latency bounds taken from the product's targets (e.g. /health within 100 ms) are
// multiplied by it, so the sanitizer pass keeps every check but the figure.
inline constexpr double kSlowdown = kSanitizedBuild ? 5.0 : 1.0;

// A test matrix laid out as one group of `variants` consecutive entries per model (e.g.
// dtype x kernel injection). The release build runs all of it; the sanitized build runs
// group g in its variant g mod `variants` only, so every model and every variant still runs
// under the sanitizers while the repeats of the same code on the same shapes do not (they
// found nothing there that one variant missed, at 5x the time).
template <typename T>
std::vector<T> sanitizer_diagonal(const std::vector<T>& matrix, size_t variants) {
  if (!kSanitizedBuild) return matrix;
  std::vector<T> kept;
  for (size_t group = 0; group * variants < matrix.size(); ++group) {
    const size_t i = group * variants + group % variants;
    if (i < matrix.size()) kept.push_back(matrix[i]);
  }
  return kept;
}

std::string read_file(const std::string& path);
std::vector<float> read_f32_file(const std::string& path);
void write_file(const std::string& path, const std::string& contents);

struct CommandResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};
// Runs `command` through /bin/sh, capturing stdout and stderr separately.
CommandResult run_command(const std::string& command);

}  // namespace tessera::testing

// Skips (visibly, with the reason) when ../shared/fixtures is absent.
#define TESSERA_REQUIRE_FIXTURES()                                                        \
  do {                                                                                    \
    if (::tessera::testing::fixtures_dir().empty())                                       \
      GTEST_SKIP() << "SKIPPED: reference fixtures not found (set TESSERA_FIXTURES or "   \
                      "place shared/fixtures beside the checkout)";                       \
  } while (0)
