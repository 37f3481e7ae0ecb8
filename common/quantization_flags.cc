#include "common/quantization_flags.h"

#include "common/config.h"

namespace tessera {

StatusOr<QuantizationOptions> quantization_from_flags(const std::string& quantize, const std::string& group,
                                                      const std::vector<std::string>& rules,
                                                      const std::string& bf16_coding) {
  const std::optional<WeightQuantization> kind = parse_weight_quantization(quantize);
  if (!kind) return invalid_argument("--quantize: unsupported \"" + quantize + "\" (expected auto, none, int8 or int4)");
  const std::optional<int> g = parse_quant_group(group);
  if (!g) return invalid_argument("--quantize-group: expected auto or a multiple of 32 in [32, 256], got \"" + group + "\"");
  const std::optional<Bf16Coding> coding = parse_bf16_coding(bf16_coding);
  if (!coding) return invalid_argument("--bf16-coding: unsupported \"" + bf16_coding + "\" (expected auto, on or off)");
  QuantizationOptions q;
  q.kind = *kind;
  q.group = *g;
  q.bf16_coding = *coding;
  for (const std::string& text : rules) {
    const size_t eq = text.rfind('=');
    const std::optional<WeightQuantization> to =
        eq == std::string::npos ? std::nullopt : parse_weight_quantization(text.substr(eq + 1));
    if (eq == std::string::npos || eq == 0 || !to || *to == WeightQuantization::kAuto) {
      return invalid_argument("--quantize-rule \"" + text + "\": expected REGEX=int8, REGEX=int4 or REGEX=none");
    }
    QuantRuleConfig rule;
    rule.match = text.substr(0, eq);
    rule.quantize = *to;
    if (Status st = compile_quant_rule_regex(&rule); !st.is_ok())
      return invalid_argument("--quantize-rule \"" + text + "\": " + st.message());
    q.rules.push_back(std::move(rule));
  }
  if (!q.rules.empty() && !q.enabled()) return invalid_argument("--quantize-rule needs --quantize int8 or int4");
  return q;
}

}  // namespace tessera
