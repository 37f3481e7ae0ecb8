// StopStringMatcher: stop strings found however the text is split into pieces, partial
// matches held back and released, and nothing at or after a stop string ever emitted.
#include "coordinator/engine/stop_string_matcher.h"

#include <gtest/gtest.h>

#include <random>

namespace tessera {
namespace {

// Feeds `pieces`; returns what was emitted (plus the flush when no stop happened).
std::string feed(StopStringMatcher& m, const std::vector<std::string>& pieces, bool* stopped) {
  std::string out;
  *stopped = false;
  for (const std::string& p : pieces) {
    StopStringMatcher::Result r = m.push(p);
    out += r.text;
    if (r.stopped) {
      *stopped = true;
      return out;
    }
  }
  return out + m.finish();
}

TEST(StopStringTest, NoStopStringsPassesTextThrough) {
  StopStringMatcher m;
  EXPECT_TRUE(m.empty());
  EXPECT_EQ(m.push("abc").text, "abc");
  EXPECT_EQ(m.finish(), "");
}

TEST(StopStringTest, EmptyStopStringsAreIgnored) {
  StopStringMatcher m({""});
  EXPECT_TRUE(m.empty());
  EXPECT_EQ(m.push("abc").text, "abc");
}

TEST(StopStringTest, HoldsBackAPossibleStartAndReleasesItWhenItFails) {
  StopStringMatcher m({"END"});
  auto r = m.push("foo E");
  EXPECT_EQ(r.text, "foo ");
  EXPECT_FALSE(r.stopped);
  r = m.push("N");
  EXPECT_EQ(r.text, "");
  r = m.push("x");
  EXPECT_EQ(r.text, "ENx");
  EXPECT_FALSE(m.stopped());
}

TEST(StopStringTest, StopSplitAcrossPieces) {
  StopStringMatcher m({"END"});
  EXPECT_EQ(m.push("ab E").text, "ab ");
  EXPECT_EQ(m.push("N").text, "");
  auto r = m.push("Dzz");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.push("more").text, "");  // nothing after a stop
}

TEST(StopStringTest, EarliestStopWinsAndOverlappingPrefixes) {
  StopStringMatcher m({"bcd", "abx", "c"});
  bool stopped = false;
  EXPECT_EQ(feed(m, {"zza", "bc", "d"}, &stopped), "zzab");
  EXPECT_TRUE(stopped);
  // "aab" holds "ab" (a prefix of "abx"), then the stop "abx" completes.
  StopStringMatcher m2({"abx"});
  EXPECT_EQ(feed(m2, {"aab", "x"}, &stopped), "a");
  EXPECT_TRUE(stopped);
}

TEST(StopStringTest, Utf8StopStrings) {
  StopStringMatcher m({"\xC3\xA9t\xC3\xA9"});  // "été"
  bool stopped = false;
  EXPECT_EQ(feed(m, {"un \xC3\xA9", "t", "\xC3\xA9 chaud"}, &stopped), "un ");
  EXPECT_TRUE(stopped);
}

// Random texts split at random points: the output is the text up to the first stop string
// complete at the moment it completes (a longer stop string that started earlier but is not
// complete yet does not hold generation back), and never contains a stop string.
TEST(StopStringTest, RandomSplitsAgreeWithWholeTextSearch) {
  std::mt19937 rng(7);
  const std::string alphabet = "ab ";
  for (int trial = 0; trial < 2000; ++trial) {
    std::string text;
    const int n = 1 + static_cast<int>(rng() % 30);
    for (int i = 0; i < n; ++i) text += alphabet[rng() % alphabet.size()];
    std::vector<std::string> stops;
    for (int s = 0, k = 1 + static_cast<int>(rng() % 3); s < k; ++s) {
      std::string stop;
      for (int i = 0, len = 1 + static_cast<int>(rng() % 4); i < len; ++i) stop += alphabet[rng() % alphabet.size()];
      stops.push_back(stop);
    }
    std::vector<std::string> pieces;
    for (size_t p = 0; p < text.size();) {
      const size_t len = 1 + rng() % 4;
      pieces.push_back(text.substr(p, len));
      p += len;
    }
    // Reference: generation stops at the first piece after which the text so far contains
    // a stop string; the output is what precedes the earliest one in that text.
    size_t first = std::string::npos;
    std::string so_far;
    for (const std::string& p : pieces) {
      so_far += p;
      for (const auto& s : stops) first = std::min(first, so_far.find(s));
      if (first != std::string::npos) break;
    }
    StopStringMatcher m(stops);
    bool stopped = false;
    const std::string out = feed(m, pieces, &stopped);
    EXPECT_EQ(stopped, first != std::string::npos) << text;
    EXPECT_EQ(out, first == std::string::npos ? text : so_far.substr(0, first)) << text;
    for (const auto& s : stops) EXPECT_EQ(out.find(s), std::string::npos) << text;
  }
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

TEST(StopStringTest, IncludeStopStringKeepsTheMatch) {
  StopStringMatcher m({"END"}, /*include_stop_string=*/true);
  bool stopped = false;
  EXPECT_EQ(feed(m, {"abc E", "N", "Dxyz"}, &stopped), "abc END");
  EXPECT_TRUE(stopped);
}

// vLLM's min_tokens: text before min_tokens cannot end the choice; a match ending later can.
TEST(StopStringTest, TextBeforeMinTokensNeverStopsButAMatchEndingAfterDoes) {
  StopStringMatcher m({"ab"});
  std::string out;
  StopStringMatcher::Result r = m.push("xab", /*may_stop=*/false);
  EXPECT_FALSE(r.stopped);
  out += r.text;
  r = m.push("cab", true);  // "ab" again, wholly after min_tokens
  out += r.text;
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(out, "xabc");

  StopStringMatcher straddle({"ab"});
  out = straddle.push("xa", false).text;
  r = straddle.push("bz", true);  // begins before, ends after: it counts
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(out + r.text, "x");
}

}  // namespace
}  // namespace tessera
