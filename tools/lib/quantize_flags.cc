#include "tools/lib/quantize_flags.h"

namespace tessera {

StatusOr<QuantizationOptions> quantization_from_flags(const std::string& quantize, int group) {
  const std::optional<WeightQuantization> kind = parse_weight_quantization(quantize);
  if (!kind) return invalid_argument("--quantize: unsupported \"" + quantize + "\" (expected none or int8)");
  if (!valid_quant_group(group)) {
    return invalid_argument("--quantize-group: expected a multiple of 32 in [32, 256], got " + std::to_string(group));
  }
  QuantizationOptions q;
  q.kind = *kind;
  q.group = group;
  return q;
}

}  // namespace tessera
