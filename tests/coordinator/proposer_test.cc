// The n-gram (prompt lookup) proposer and speculative.* validation.
#include "coordinator/engine/proposer.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

using Ids = std::vector<int32_t>;

TEST(NgramProposer, ProposesWhatFollowedTheLongestMatchingSuffixAtItsLatestPlace) {
  const NgramProposer p(1, 3);
  // Suffix [7 8 9] occurs at 0 (then 1 2) and at 5 (then 4 4): the latest wins.
  EXPECT_EQ(p.propose(Ids{7, 8, 9, 1, 2, 7, 8, 9, 4, 4, 7, 8, 9}, {}, 2), (Ids{4, 4}));
  // Only [9] matches (at 1): proposals stop at the end of the sequence.
  EXPECT_EQ(p.propose(Ids{5, 9, 6, 3, 9}, {}, 8), (Ids{6, 3, 9}));
  // The longest suffix is tried first: [2 3] at 3 beats [3] at 6.
  EXPECT_EQ(p.propose(Ids{1, 2, 3, 2, 3, 5, 3, 0, 9, 2, 3}, {}, 1), (Ids{5}));
}

TEST(NgramProposer, NoMatchNoRoomOrTooShortGivesNothing) {
  const NgramProposer p(2, 3);
  EXPECT_TRUE(p.propose(Ids{1, 2, 3, 4}, {}, 4).empty());      // no repeated pair
  EXPECT_TRUE(p.propose(Ids{1, 2, 1, 2}, {}, 0).empty());      // no room
  EXPECT_TRUE(p.propose(Ids{1}, {}, 4).empty());               // nothing before the suffix
  EXPECT_EQ(p.propose(Ids{1, 2, 1, 2}, {}, 4), (Ids{1, 2}));  // [1 2] at 0, then 1 2
}

TEST(SpeculativeConfigCheck, EachBadFieldIsNamed) {
  SpeculativeConfig c;
  c.method = SpeculativeConfig::Method::kNgram;
  EXPECT_TRUE(validate_speculative_config(c).is_ok());
  c.num_tokens = 0;
  EXPECT_NE(validate_speculative_config(c).message().find("speculative.num_tokens must be in [1, 16], got 0"),
            std::string::npos);
  c.num_tokens = 17;
  EXPECT_FALSE(validate_speculative_config(c).is_ok());
  c.num_tokens = 4;
  c.ngram_min = 5;
  c.ngram_max = 3;
  EXPECT_NE(validate_speculative_config(c).message().find("speculative.ngram_max (3) must be at least speculative.ngram_min (5)"),
            std::string::npos);
  EXPECT_EQ(make_proposer(SpeculativeConfig{}), nullptr);
  c = SpeculativeConfig{};
  c.method = SpeculativeConfig::Method::kDraft;
  EXPECT_NE(validate_speculative_config(c).message().find("speculative.draft_model: required with speculative.method draft"),
            std::string::npos);
  c.draft_model = "/models/draft";
  EXPECT_TRUE(validate_speculative_config(c).is_ok());
  c.method = SpeculativeConfig::Method::kNgram;
  EXPECT_NE(validate_speculative_config(c).message().find("speculative.draft_model: given while speculative.method is not draft"),
            std::string::npos);
}

TEST(ExecutorProposer, HandsOnTheExecutorsProposalsUpToTheRoom) {
  const std::unique_ptr<Proposer> p = make_proposer(SpeculativeConfig{SpeculativeConfig::Method::kDraft, 4, 1, 4, "d"});
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(p->made_on_executors());
  EXPECT_EQ(p->propose(Ids{1, 2}, Ids{5, 6, 7}, 2), (Ids{5, 6}));
  EXPECT_EQ(p->propose(Ids{1, 2}, Ids{5, 6, 7}, 8), (Ids{5, 6, 7}));
  EXPECT_TRUE(p->propose(Ids{1, 2}, Ids{}, 4).empty());
  EXPECT_TRUE(p->propose(Ids{1, 2}, Ids{5}, 0).empty());
  EXPECT_FALSE(NgramProposer(1, 2).made_on_executors());
}

}  // namespace
}  // namespace tessera
