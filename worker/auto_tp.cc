#include "worker/auto_tp.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>

#include "common/check.h"
#include "common/string_util.h"
#include "common/tokenizer/regex.h"

namespace tessera {

// TpPlan has no source file of its own yet; its two functions live with the planner.
namespace {

constexpr TensorRole kUnknown = TensorRole::kCount;

// What the architecture table says about one checkpoint name.
struct NameInfo {
  TensorRole role = kUnknown;
  int layer = -1;         // -1 outside the transformer blocks
  bool is_bias = false;
  std::string weight;     // the weight this name belongs to ("x.bias" -> "x.weight")
  std::string in_block;   // module path inside its block ("self_attn.o_proj"), "" outside
};

// Matches `name` against a pattern whose "{L}"/"{E}" stand for decimal numbers.
bool match_pattern(const std::string& pattern, const std::string& name, int* layer) {
  size_t p = 0, n = 0;
  while (p < pattern.size()) {
    if (pattern.compare(p, 3, "{L}") == 0 || pattern.compare(p, 3, "{E}") == 0) {
      size_t start = n;
      while (n < name.size() && std::isdigit(static_cast<unsigned char>(name[n]))) ++n;
      if (n == start || n - start > 9) return false;
      if (pattern[p + 1] == 'L') *layer = std::stoi(name.substr(start, n - start));
      p += 3;
    } else {
      if (n >= name.size() || name[n] != pattern[p]) return false;
      ++p;
      ++n;
    }
  }
  return n == name.size();
}

std::string module_path(const std::string& weight_name) {
  return weight_name.ends_with(".weight") ? weight_name.substr(0, weight_name.size() - 7) : weight_name;
}

NameInfo classify(const ArchSpec& arch, const std::string& name) {
  NameInfo info;
  info.is_bias = name.ends_with(".bias");
  info.weight = info.is_bias ? name.substr(0, name.size() - 5) + ".weight" : name;
  for (size_t r = 0; r < static_cast<size_t>(TensorRole::kCount) && info.role == kUnknown; ++r) {
    if (arch.names[r].empty()) continue;
    for (const std::string& pattern : name_alternatives(arch.names[r])) {
      int layer = -1;
      if (match_pattern(pattern, info.weight, &layer)) {
        info.role = static_cast<TensorRole>(r);
        info.layer = layer;
        break;
      }
    }
  }
  // The block prefix ("model.layers.") comes from the attention norm's pattern.
  const std::string norm = name_alternatives(arch.name_of(TensorRole::kAttnNorm))[0];
  const std::string prefix = norm.substr(0, norm.find("{L}"));
  const std::string module = module_path(info.weight);
  if (module.rfind(prefix, 0) == 0) {
    size_t i = prefix.size(), start = i;
    while (i < module.size() && std::isdigit(static_cast<unsigned char>(module[i]))) ++i;
    if (i > start && i < module.size() && module[i] == '.') {
      if (info.layer < 0) info.layer = std::stoi(module.substr(start, i - start));
      info.in_block = module.substr(i + 1);
    }
  }
  return info;
}

// Norms (and learned positions, which are as small and as whole): never split.
bool is_norm(TensorRole r) {
  switch (r) {
    case TensorRole::kEmbedNorm:
    case TensorRole::kFinalNorm:
    case TensorRole::kAttnNorm:
    case TensorRole::kMlpNorm:
    case TensorRole::kPostAttnNorm:
    case TensorRole::kPostMlpNorm:
    case TensorRole::kQNorm:
    case TensorRole::kKNorm:
    case TensorRole::kPosEmbed: return true;
    default: return false;
  }
}
bool is_vocab(TensorRole r) { return r == TensorRole::kEmbed || r == TensorRole::kLmHead; }
// Linears (and tensors the table does not know) are what DeepSpeed's lists may move.
bool is_linear(TensorRole r) { return !is_norm(r) && !is_vocab(r); }

TpRole builtin_role(TensorRole r) {
  switch (r) {
    case TensorRole::kEmbed:
    case TensorRole::kLmHead: return TpRole::kVocab;
    case TensorRole::kQ:
    case TensorRole::kK:
    case TensorRole::kV:
    case TensorRole::kQkv:  // fused q|k|v: split per head
    case TensorRole::kGate:
    case TensorRole::kUp:
    case TensorRole::kGateUp:  // fused gate|up: each half split alike
    case TensorRole::kExpertGate:
    case TensorRole::kExpertUp:
    case TensorRole::kSharedGate:
    case TensorRole::kSharedUp: return TpRole::kColumn;
    case TensorRole::kO:
    case TensorRole::kDown:
    case TensorRole::kExpertDown:
    case TensorRole::kSharedDown: return TpRole::kRow;
    default: return TpRole::kKeep;  // norms, MoE router, shared-expert gate, unknown tensors
  }
}

// DeepSpeed's suffix match: "w2" names "...experts.0.w2", "gate" names "block_sparse_moe.gate".
bool suffix_matches(const std::string& module, const std::string& item) {
  return module == item || module.ends_with("." + item);
}

bool model_type_matches(const ModelConfig& config, const std::string& value) {
  const std::string v = ascii_lower(value);
  return v == ascii_lower(config.model_type) || (config.arch != nullptr && v == config.arch->name);
}

std::string blocks_of(const ArchSpec& arch) {
  std::string out;
  for (const std::string& block : arch.hf_blocks) out += (out.empty() ? "" : ", ") + block;
  return out;
}

std::string layer_text(const NameInfo& info) {
  return info.layer >= 0 ? " (layer " + std::to_string(info.layer) + ")" : "";
}

// The size a role splits and what it is called, from config.json; size 0 when unknown.
struct SplitDim {
  int64_t size = 0;
  std::string what;
  bool kv = false;  // kv heads: may also be replicated (world % kv_heads == 0)
};

SplitDim split_dim(const ModelConfig& c, TensorRole r, TpRole role) {
  const bool out = role == TpRole::kColumn || role == TpRole::kVocab;
  const SplitDim hidden{c.hidden, "hidden_size"};
  switch (r) {
    case TensorRole::kQ:
    case TensorRole::kQkv: return out ? SplitDim{c.heads, "num_attention_heads"} : hidden;
    case TensorRole::kK:
    case TensorRole::kV: return out ? SplitDim{c.kv_heads, "num_key_value_heads", true} : hidden;
    case TensorRole::kO: return out ? hidden : SplitDim{c.heads, "num_attention_heads"};
    case TensorRole::kGate:
    case TensorRole::kUp:
    case TensorRole::kGateUp: return out ? SplitDim{c.ffn, "intermediate_size"} : hidden;
    case TensorRole::kDown: return out ? hidden : SplitDim{c.ffn, "intermediate_size"};
    case TensorRole::kExpertGate:
    case TensorRole::kExpertUp: return out ? SplitDim{c.moe_ffn, "the experts' intermediate size"} : hidden;
    case TensorRole::kExpertDown: return out ? hidden : SplitDim{c.moe_ffn, "the experts' intermediate size"};
    case TensorRole::kSharedGate:
    case TensorRole::kSharedUp: return out ? SplitDim{c.shared_ffn, "shared_expert_intermediate_size"} : hidden;
    case TensorRole::kSharedDown: return out ? hidden : SplitDim{c.shared_ffn, "shared_expert_intermediate_size"};
    case TensorRole::kRouter: return out ? SplitDim{c.num_experts, "num_local_experts"} : hidden;
    case TensorRole::kEmbed:
    case TensorRole::kLmHead: return out ? SplitDim{c.vocab, "vocab_size"} : hidden;
    default: return {};
  }
}

Status check_split(const std::string& name, const NameInfo& info, TpRole role, const SplitDim& dim, int world) {
  if (role == TpRole::kKeep || dim.size == 0 || world == 1) return Status::ok();
  if (dim.size % world == 0) return Status::ok();
  const std::string w = std::to_string(world), s = std::to_string(dim.size);
  // KV heads follow the query heads: each rank keeps the KV heads its query heads read
  // (kv_heads_for_rank), replicated on neighbouring ranks when they do not divide evenly.
  if (dim.kv) return Status::ok();
  // An uneven vocabulary is cut in ceil(vocab / world) rows per rank, the last rank taking
  // fewer; the LM head pads its logits to the common width for the all-gather.
  if (role == TpRole::kVocab) return Status::ok();
  return invalid_argument(name + layer_text(info) + ": " + tp_role_name(role) + " split needs " + dim.what + " " + s +
                          " divisible by tensor_parallel " + w);
}

}  // namespace

// ---- DeepSpeed environment variables ------------------------------------------------------

Status parse_ds_env_items(const char* var_name, const char* value, std::map<std::string, std::string>* out) {
  const std::string name = var_name ? var_name : "?";
  const std::string s = value ? value : "";
  size_t i = 0;
  auto fail = [&](const std::string& what) {
    return invalid_argument("environment variable " + name + "=\"" + s + "\": " + what + " at character " +
                            std::to_string(i + 1) + " (expected a dict like {'w2':'mixtral'})");
  };
  auto skip_ws = [&] {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  };
  auto quoted = [&](std::string* str) -> Status {
    if (i >= s.size() || (s[i] != '\'' && s[i] != '"')) return fail("expected a quoted string");
    const char q = s[i++];
    str->clear();
    while (i < s.size() && s[i] != q) {
      if (s[i] == '\\' && i + 1 < s.size()) ++i;
      *str += s[i++];
    }
    if (i >= s.size()) return fail("unterminated string");
    ++i;
    if (str->empty()) return fail("empty string");
    return Status::ok();
  };
  skip_ws();
  if (i == s.size()) return Status::ok();  // unset or blank: nothing
  if (s[i] != '{') return fail("expected '{'");
  ++i;
  std::map<std::string, std::string> items;
  while (true) {
    skip_ws();
    if (i < s.size() && s[i] == '}') break;
    std::string key, val;
    TESSERA_RETURN_IF_ERROR(quoted(&key));
    skip_ws();
    if (i >= s.size() || s[i] != ':') return fail("expected ':'");
    ++i;
    skip_ws();
    TESSERA_RETURN_IF_ERROR(quoted(&val));
    items[key] = val;
    skip_ws();
    if (i < s.size() && s[i] == ',') {
      ++i;
      continue;
    }
    if (i < s.size() && s[i] == '}') break;
    return fail("expected ',' or '}'");
  }
  ++i;
  skip_ws();
  if (i != s.size()) return fail("unexpected text after '}'");
  for (auto& [k, v] : items) (*out)[k] = v;
  return Status::ok();
}

AutoTpOptions auto_tp_options_from(const TesseraConfig& config, bool use_env) {
  AutoTpOptions o;
  o.all_reduce_linear = config.parallel.auto_tp.all_reduce_linear;
  o.keep_linear = config.parallel.auto_tp.keep_linear;
  o.injection_policy = config.parallel.injection_policy;
  o.rules = config.parallel.auto_tp.rules;
  if (use_env) {
    for (auto [var, target] : {std::pair{"DS_ALL_REDUCE_LINEAR_ITEMS", &o.all_reduce_linear},
                               std::pair{"DS_KEEP_LINEAR_ITEMS", &o.keep_linear}}) {
      Status st = parse_ds_env_items(var, std::getenv(var), target);
      if (!st.is_ok() && o.status.is_ok()) o.status = st;
    }
  }
  return o;
}

// ---- the planner ------------------------------------------------------------------------------

StatusOr<TpPlan> plan_tensor_parallel(const ModelConfig& config, const std::vector<std::string>& tensor_names,
                                      const AutoTpOptions& options, int world_size) {
  TESSERA_RETURN_IF_ERROR(options.status);
  if (config.arch == nullptr) return invalid_argument("auto-TP: the model config has no architecture");
  if (world_size < 1) return invalid_argument("auto-TP: tensor_parallel must be >= 1, got " + std::to_string(world_size));
  const ArchSpec& arch = *config.arch;

  // injection_policy: only the block of this architecture may be named.
  const std::vector<std::string>* policy = nullptr;
  std::string policy_block;
  for (const auto& [block, linears] : options.injection_policy) {
    const auto& block_name = block;  // clang before 16 cannot capture a structured binding
    if (find_arch_by_block(block_name) != &arch) {
      return invalid_argument("parallel.injection_policy: '" + block + "' is not a block of model_type " +
                              config.model_type + " (its block is " + blocks_of(arch) + ")");
    }
    policy = &linears;
    policy_block = block;
  }
  // The config reader compiled its rules; a rule built in code is compiled here.
  std::vector<std::shared_ptr<const tok::Regex>> rules;
  for (size_t i = 0; i < options.rules.size(); ++i) {
    TpRuleConfig rule = options.rules[i];
    if (!rule.regex) {
      if (Status st = compile_tp_rule_regex(&rule); !st.is_ok())
        return invalid_argument("parallel.auto_tp.rules[" + std::to_string(i) + "].match: " + st.message());
    }
    rules.push_back(rule.regex);
  }
  std::vector<bool> policy_used(policy ? policy->size() : 0, false);

  TpPlan plan;
  plan.world_size = world_size;
  for (const std::string& name : tensor_names) {
    const NameInfo info = classify(arch, name);
    const std::string module = module_path(info.weight);
    TpRole role = builtin_role(info.role);
    if (is_linear(info.role)) {
      for (const auto& [item, type] : options.all_reduce_linear) {
        if (suffix_matches(module, item) && model_type_matches(config, type)) role = TpRole::kRow;
      }
      for (const auto& [item, type] : options.keep_linear) {
        if (suffix_matches(module, item) && model_type_matches(config, type)) role = TpRole::kKeep;
      }
      if (policy != nullptr && !info.in_block.empty() && info.role != TensorRole::kRouter) {
        role = TpRole::kColumn;
        for (size_t i = 0; i < policy->size(); ++i) {
          if (suffix_matches(info.in_block, (*policy)[i])) {
            role = TpRole::kRow;
            policy_used[i] = true;
          }
        }
      }
    }
    for (size_t i = 0; i < rules.size(); ++i) {
      if (!rules[i]->search(info.weight)) continue;
      const TpRole r = options.rules[i].role;
      const std::string where = "parallel.auto_tp.rules[" + std::to_string(i) + "] ('" + options.rules[i].match + "')";
      if (is_norm(info.role) && r != TpRole::kKeep) {
        return invalid_argument(where + ": " + name + " is a norm; norms can only be keep");
      }
      if (is_vocab(info.role) && r == TpRole::kRow) {
        return invalid_argument(where + ": " + name + " is an embedding; it can be column (vocab rows) or keep");
      }
      role = r;
      if (is_vocab(info.role) && role == TpRole::kColumn) role = TpRole::kVocab;
      break;
    }
    if (!info.is_bias) {
      TESSERA_RETURN_IF_ERROR(check_split(name, info, role, split_dim(config, info.role, role), world_size));
    }
    plan.roles[name] = role;
  }
  // A bias takes its weight's role.
  for (auto& [name, role] : plan.roles) {
    if (!name.ends_with(".bias")) continue;
    auto it = plan.roles.find(name.substr(0, name.size() - 5) + ".weight");
    if (it != plan.roles.end()) role = it->second;
  }
  for (size_t i = 0; i < policy_used.size(); ++i) {
    if (!policy_used[i]) {
      return invalid_argument("parallel.injection_policy." + policy_block + ": '" + (*policy)[i] +
                              "' names no linear of the block");
    }
  }
  return plan;
}

// ---- slices -----------------------------------------------------------------------------------

namespace {

bool is_fused(TensorRole r) { return r == TensorRole::kQkv || r == TensorRole::kGateUp; }

// Rows one rank holds of a column-split fused tensor.
int64_t fused_rows_per_rank(const ModelConfig& c, TensorRole r, int world) {
  if (r == TensorRole::kGateUp) return 2 * c.ffn / world;
  const KvHeadRange kv = kv_heads_for_rank(c.heads, c.kv_heads, 0, world);
  return (c.heads / world + 2 * kv.count) * c.head_dim;
}

bool kv_replicated(const ModelConfig& c, TensorRole r, TpRole role, int world) {
  return (r == TensorRole::kK || r == TensorRole::kV) && role == TpRole::kColumn && c.kv_heads > 0 &&
         c.kv_heads % world != 0;
}

}  // namespace

Status check_tp_plan_shapes(const TpPlan& plan, const ModelConfig& config,
                            const std::map<std::string, std::vector<int64_t>>& full_shapes) {
  const int world = plan.world_size;
  if (world == 1 || config.arch == nullptr) return Status::ok();
  for (const auto& [name, shape] : full_shapes) {
    const TpRole role = plan.role_of(name);
    if (role == TpRole::kKeep) continue;
    const NameInfo info = classify(*config.arch, name);
    if (kv_replicated(config, info.role, role, world)) continue;
    // Fused q|k|v and gate|up are gathered per head / per half (the heads and the
    // intermediate size were checked above, by check_split).
    if (is_fused(info.role) && role == TpRole::kColumn) continue;
    const bool one_d = shape.size() == 1;
    if (role == TpRole::kRow && one_d) continue;  // bias added once after the all-reduce
    size_t axis = role == TpRole::kRow ? 1 : 0;
    if (config.arch->conv1d_weights && shape.size() == 2 && info.role != TensorRole::kLmHead &&
        info.role != TensorRole::kEmbed) {
      axis = 1 - axis;  // stored [in, out]
    }
    if (shape.empty() || shape.size() > 2) {
      return invalid_argument(name + layer_text(info) + ": a " + tp_role_name(role) +
                              " split needs a 2-D weight (or 1-D bias), got rank " + std::to_string(shape.size()));
    }
    if (shape[axis] % world != 0) {
      return invalid_argument(name + layer_text(info) + ": " + tp_role_name(role) + " split of dimension " +
                              std::to_string(axis) + " (size " + std::to_string(shape[axis]) +
                              ") is not divisible by tensor_parallel " + std::to_string(world));
    }
    const SplitDim dim = split_dim(config, info.role, role);
    if (dim.size > 0 && dim.size % world != 0) {
      TESSERA_RETURN_IF_ERROR(check_split(name, info, role, dim, world));
    }
  }
  return Status::ok();
}

TpSlice slice_for(const TpPlan& plan, const ModelConfig& config, const std::string& tensor,
                  const std::vector<int64_t>& full_shape, int rank) {
  const int world = plan.world_size;
  TESSERA_CHECK(rank >= 0 && rank < world) << "rank " << rank << " of " << world;
  const TpRole role = plan.role_of(tensor);
  if (world == 1 || role == TpRole::kKeep || full_shape.empty()) return TpSlice{};
  const bool one_d = full_shape.size() == 1;
  if (role == TpRole::kRow && one_d) return TpSlice{};  // bias: whole, added once
  const TensorRole r = config.arch ? classify(*config.arch, tensor).role : kUnknown;
  if (kv_replicated(config, r, role, world)) {
    const KvHeadRange kv = kv_heads_for_rank(config.heads, config.kv_heads, rank, world);
    TESSERA_CHECK_EQ(full_shape[0], config.kv_heads * config.head_dim) << tensor;
    return TpSlice{0, kv.first * config.head_dim, kv.count * config.head_dim};
  }
  int axis = role == TpRole::kRow ? 1 : 0;
  if (config.arch != nullptr && config.arch->conv1d_weights && full_shape.size() == 2 && r != TensorRole::kLmHead &&
      r != TensorRole::kEmbed) {
    axis = 1 - axis;  // GPT-2's Conv1D weights are stored [in, out]
  }
  TESSERA_CHECK(static_cast<size_t>(axis) < full_shape.size()) << tensor << ": no axis " << axis;
  const int64_t dim = full_shape[axis];
  if (role == TpRole::kVocab) {  // ceil-sized chunks; see check_split
    const int64_t chunk = (dim + world - 1) / world;
    const int64_t begin = std::min<int64_t>(rank * chunk, dim);
    return TpSlice{0, begin, std::min(chunk, dim - begin)};
  }
  TESSERA_CHECK(dim % world == 0) << tensor << ": dimension " << axis << " (" << dim << ") % " << world;
  // Head-structured dims (q rows [heads, head_dim], BLOOM's fused [heads, 3, head_dim], o
  // columns) split on head boundaries because heads % world == 0 was checked by the planner.
  const int64_t count = dim / world;
  return TpSlice{axis, rank * count, count};
}

std::string format_tp_plan(const TpPlan& plan, const ModelConfig& config,
                           const std::map<std::string, std::vector<int64_t>>& full_shapes) {
  auto shape_text = [](const std::vector<int64_t>& s) {
    std::string out = "[";
    for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + "]";
  };
  struct Row {
    std::string name, role, full, per_rank, note;
  };
  std::vector<Row> rows;
  std::map<std::string, int> counts;
  for (const auto& [name, role] : plan.roles) {
    Row row{name, tp_role_name(role), "?", "?", ""};
    ++counts[row.role];
    auto it = full_shapes.find(name);
    if (it != full_shapes.end()) {
      const auto& full = it->second;
      row.full = shape_text(full);
      const TensorRole r = config.arch ? classify(*config.arch, name).role : kUnknown;
      std::vector<int64_t> part = full;
      const bool fused = is_fused(r) && role == TpRole::kColumn && plan.world_size > 1 && !full.empty();
      if (fused) {
        // GPT-2 stores its Conv1D weights [in, out]: the split axis is the last one.
        const size_t axis = config.arch->conv1d_weights && full.size() == 2 ? 1 : 0;
        part[axis] = fused_rows_per_rank(config, r, plan.world_size);
      } else {
        TpSlice s = slice_for(plan, config, name, full, 0);
        if (!s.whole()) part[s.axis] = s.count;
      }
      row.per_rank = shape_text(part);
      if (fused) {
        row.note = r == TensorRole::kQkv ? "q|k|v rows of each rank's heads" : "gate and up halves split alike";
      } else if (kv_replicated(config, r, role, plan.world_size)) {
        row.note = "kv head = rank / " + std::to_string(plan.world_size / config.kv_heads) + " (replicated)";
      } else if (role == TpRole::kRow && full.size() == 1) {
        row.note = "added once after all-reduce";
      }
    }
    rows.push_back(std::move(row));
  }
  size_t w0 = 6, w1 = 4, w2 = 10, w3 = 14;
  for (const Row& r : rows) {
    w0 = std::max(w0, r.name.size());
    w1 = std::max(w1, r.role.size());
    w2 = std::max(w2, r.full.size());
    w3 = std::max(w3, r.per_rank.size());
  }
  std::ostringstream out;
  out << "tensor-parallel plan: model_type " << config.model_type << ", tensor_parallel " << plan.world_size << ", "
      << plan.roles.size() << " tensors (";
  bool first = true;
  for (const auto& [role, n] : counts) {
    out << (first ? "" : ", ") << n << " " << role;
    first = false;
  }
  out << ")\n";
  auto pad = [](const std::string& s, size_t w) { return s + std::string(w > s.size() ? w - s.size() : 0, ' '); };
  out << pad("tensor", w0) << "  " << pad("role", w1) << "  " << pad("full shape", w2) << "  "
      << pad("per-rank shape", w3) << "\n";
  for (const Row& r : rows) {
    std::string line = pad(r.name, w0) + "  " + pad(r.role, w1) + "  " + pad(r.full, w2) + "  " + pad(r.per_rank, w3);
    if (!r.note.empty()) line += "  " + r.note;
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out << line << "\n";
  }
  return out.str();
}

}  // namespace tessera
