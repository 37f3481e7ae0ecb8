#pragma once
// tokenizer.json `post_processor`, applied when special tokens are requested (BOS/EOS).
// Supported: TemplateProcessing (single-sequence template), ByteLevel (ids unchanged),
// RobertaProcessing, BertProcessing, Sequence.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/tokenizer/json_fields.h"

namespace tessera::tok {

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  virtual void process(std::vector<int32_t>& ids) const = 0;
  // Ids the template puts before / after the sequence (for tokenizer_config overrides).
  virtual void template_ids(std::vector<int32_t>& before, std::vector<int32_t>& after) const {}
};

// `token_to_id` resolves token strings named by Roberta/Bert processors.
StatusOr<std::unique_ptr<PostProcessor>> parse_post_processor(
    const Json& j, const std::string& where, const std::function<int32_t(const std::string&)>& token_to_id);

// [before..., sequence..., after...]
std::unique_ptr<PostProcessor> make_wrap_processor(std::vector<int32_t> before, std::vector<int32_t> after);

}  // namespace tessera::tok
