// validate_request names the limit a request breaks: max_model_len, the whole KV pool, or the
// token budget without chunked prefill (coordinator/engine/request.h).
#include <gtest/gtest.h>

#include "coordinator/engine/request.h"

namespace tessera {
namespace {

Request request_of_len(int prompt_len, int max_tokens) {
  Request r;
  r.prompt.assign(static_cast<size_t>(prompt_len), 1);
  r.max_tokens = max_tokens;
  return r;
}

RequestLimits limits(int max_model_len, int max_sequence_len, int num_blocks, int block_size) {
  RequestLimits l;
  l.max_model_len = max_model_len;
  l.max_sequence_len = max_sequence_len;
  l.num_blocks = num_blocks;
  l.block_size = block_size;
  l.max_tokens_must_fit = true;
  return l;
}

TEST(RequestLimits, ContextLimitIsNamedAsMaxModelLen) {
  const RequestLimits l = limits(128, 128, 100, 16);
  EXPECT_EQ(sequence_limit_name(l), "max_model_len 128");
  const Status st = validate_request(request_of_len(100, 29), l);
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.message(), "prompt (100 tokens) + max_tokens (29) = 129 exceeds max_model_len 128");
  EXPECT_TRUE(validate_request(request_of_len(100, 28), l).is_ok());
}

TEST(RequestLimits, ASmallerKvPoolIsNamedWithItsBlocks) {
  const RequestLimits l = limits(2048, 64, 4, 16);
  const Status st = validate_request(request_of_len(10, 60), l);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("= 70 exceeds the 64 tokens the whole KV pool holds (4 blocks of 16 tokens: "
                              "cache.num_blocks"),
            std::string::npos)
      << st.message();
  // n does not change what one choice needs: choices take turns in the pool.
  Request wide = request_of_len(10, 54);
  wide.n = 16;
  EXPECT_TRUE(validate_request(wide, l).is_ok());
}

TEST(RequestLimits, TheTokenBudgetWithoutChunkedPrefillIsNamed) {
  RequestLimits l = limits(2048, 512, 1000, 16);
  l.chunked_prefill = false;
  l.max_num_batched_tokens = 512;
  EXPECT_EQ(sequence_limit_name(l), "scheduler.max_num_batched_tokens 512 (scheduler.chunked_prefill is off)");
}

}  // namespace
}  // namespace tessera
