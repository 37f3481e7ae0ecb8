// tessera-make-checkpoint: writes a random-weight model in Hugging Face layout (config.json as
// transformers' save_pretrained writes it, model.safetensors or shards +
// model.safetensors.index.json; with --format bin, pytorch_model.bin or shards +
// pytorch_model.bin.index.json in torch.save's zip format) for any architecture of the table (worker/arch_spec.cc):
// config keys from the row, tensors from the loader's own list (worker/arch_tensors.h), so
// that benchmarks and tests can use models of any size and family without downloading one. Weights are deterministic in --seed and the tensor name (sharding does not
// change them) and are written chunk by chunk, so memory stays small whatever the model size.
// With --lora-of MODEL it writes a random PEFT LoRA adapter of that model instead
// (tools/lib/random_lora.h).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/logging.h"
#include "common/checkpoint/torch_writer.h"
#include "common/safetensors_writer.h"
#include "common/status.h"
#include "tools/lib/padded_checkpoint.h"
#include "tools/lib/random_lora.h"
#include "worker/arch_spec.h"
#include "worker/arch_tensors.h"
#include "worker/model_config.h"
#include "common/fnv1a.h"
#include "common/splitmix64.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

struct ModelShape {
  std::string arch;  // a row of the architecture table (worker/arch_spec.cc)
  int64_t hidden = 64, layers = 2, heads = 4, kv_heads = 2, ffn = 128, vocab = 512;
  int64_t experts = 4, top_k = 2, max_positions = 2048;
  double rope_theta = 10000.0;
  bool tie = false;
};

const ArchSpec* find_row(const std::string& name) {
  for (const ArchSpec& spec : arch_specs()) {
    if (spec.name == name) return &spec;
  }
  return nullptr;
}

std::string row_names() {
  std::string out;
  for (const ArchSpec& spec : arch_specs()) out += (out.empty() ? "" : ", ") + spec.name;
  return out;
}

Status validate(const ModelShape& m, const ArchSpec& a) {
  for (auto [flag, v] : {std::pair{"--hidden", m.hidden}, {"--layers", m.layers}, {"--heads", m.heads},
                         {"--kv-heads", m.kv_heads}, {"--ffn", m.ffn}, {"--vocab", m.vocab},
                         {"--experts", m.experts}, {"--top-k", m.top_k}, {"--max-positions", m.max_positions}}) {
    if (v <= 0) return invalid_argument(std::string(flag) + " must be positive, got " + std::to_string(v));
  }
  if (m.hidden % m.heads != 0) {
    return invalid_argument("--heads " + std::to_string(m.heads) + " does not divide --hidden " +
                            std::to_string(m.hidden));
  }
  if (m.heads % m.kv_heads != 0) {
    return invalid_argument("--kv-heads " + std::to_string(m.kv_heads) + " does not divide --heads " +
                            std::to_string(m.heads));
  }
  if (a.keys.kv_heads.empty() && m.kv_heads != m.heads) {
    return invalid_argument(a.name + " has no grouped-query attention: --kv-heads must equal --heads");
  }
  if (a.keys.ffn.empty() && m.ffn != a.ffn_multiple * m.hidden) {
    return invalid_argument(a.name + "'s MLP is " + std::to_string(a.ffn_multiple) + " * hidden wide: --ffn must be " +
                            std::to_string(a.ffn_multiple * m.hidden));
  }
  if (a.moe && m.top_k > m.experts) {
    return invalid_argument("--top-k " + std::to_string(m.top_k) + " exceeds --experts " + std::to_string(m.experts));
  }
  if (!(m.rope_theta > 0)) return invalid_argument("--rope-theta must be positive");
  return Status::ok();
}

// config.json from the row: its family-specific keys (config_extras) plus the shape under
// the row's own key names, as save_pretrained() writes them (see shared/fixtures/tiny-*).
nlohmann::json make_config(const ModelShape& m, const ArchSpec& a, DType dtype) {
  nlohmann::json c = nlohmann::json::parse(a.config_extras);
  const ConfigKeys& k = a.keys;
  c["architectures"] = {a.hf_architecture};
  c["model_type"] = a.model_types[0];
  c["bos_token_id"] = 1;
  c["eos_token_id"] = 2;
  c["initializer_range"] = 0.02;
  c["attention_dropout"] = 0.0;
  c["torch_dtype"] = dtype_name(dtype);
  c["transformers_version"] = "4.47.1";
  c["use_cache"] = true;
  c["vocab_size"] = m.vocab;
  c[k.hidden[0]] = m.hidden;
  c[k.layers[0]] = m.layers;
  c[k.heads[0]] = m.heads;
  if (!k.kv_heads.empty()) c[k.kv_heads[0]] = m.kv_heads;
  if (!k.head_dim.empty()) c[k.head_dim[0]] = m.hidden / m.heads;
  if (!k.ffn.empty()) c[k.ffn[0]] = m.ffn;
  c[k.norm_eps[0]] = 1e-5;
  if (a.position == PositionKind::kRotary && !k.rope_theta.empty()) c[k.rope_theta[0]] = m.rope_theta;
  if (!k.max_positions.empty()) c[k.max_positions[0]] = m.max_positions;
  if (a.moe) {
    c[k.experts[0]] = m.experts;
    c["num_experts_per_tok"] = m.top_k;
    if (!k.moe_ffn.empty()) c[k.moe_ffn[0]] = m.ffn;
    if (a.shared_expert) c["shared_expert_intermediate_size"] = m.ffn;
  }
  // A family whose default is tied (BLOOM, Gemma, GPT-2) writes the key only to untie.
  if (!a.tie_embeddings_default || !m.tie) c["tie_word_embeddings"] = m.tie;
  return c;
}

// splitmix64: tiny, fast and good enough for weights; one stream per tensor.
struct Rng {
  uint64_t s;
  uint64_t next() {
    const uint64_t z = splitmix64(s);
    s += kSplitmix64Gamma;
    return z;
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
};

// Box-Muller, two normals per pair of uniforms: mean + std * N(0, 1).
void fill_normal(Rng& rng, float* out, size_t n, float mean, float std) {
  constexpr double kTwoPi = 6.283185307179586;
  for (size_t i = 0; i < n; i += 2) {
    double r = std::sqrt(-2.0 * std::log(1.0 - rng.uniform()));  // 1 - u in (0, 1]
    double a = kTwoPi * rng.uniform();
    out[i] = mean + std * static_cast<float>(r * std::cos(a));
    if (i + 1 < n) out[i + 1] = mean + std * static_cast<float>(r * std::sin(a));
  }
}

int64_t numel(const ExpectedTensor& t) {
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  return n;
}

// `append` is the writer's (safetensors or PyTorch zip: the bytes are the same).
Status write_tensor(const std::function<Status(const void*, size_t)>& append, const ExpectedTensor& spec, DType dtype,
                    uint64_t seed) {
  constexpr size_t kChunk = 1 << 20;  // elements per chunk: 4 MB of f32
  Rng rng{seed ^ fnv1a64(spec.name)};
  rng.next();
  float mean = spec.kind == ExpectedTensor::Kind::kNorm ? 1.f : 0.f;
  std::vector<float> f32(std::min<size_t>(kChunk, static_cast<size_t>(numel(spec))));
  std::vector<uint16_t> half(dtype == DType::kF32 ? 0 : f32.size());
  for (size_t done = 0, total = static_cast<size_t>(numel(spec)); done < total;) {
    size_t n = std::min(kChunk, total - done);
    fill_normal(rng, f32.data(), n, mean, 0.02f);
    if (dtype == DType::kF32) {
      TESSERA_RETURN_IF_ERROR(append(f32.data(), n * 4));
    } else {
      convert_elements(f32.data(), DType::kF32, half.data(), dtype, n);
      TESSERA_RETURN_IF_ERROR(append(half.data(), n * 2));
    }
    done += n;
  }
  return Status::ok();
}

struct Options {
  ModelShape shape;
  std::string out;
  DType dtype = DType::kF32;
  uint64_t seed = 0;
  double shard_mb = 0;  // 0: one model.safetensors
  bool torch_bin = false;  // --format bin: pytorch_model*.bin (torch.save's zip format)
  std::vector<std::string> config_sets;  // "key=value" pairs applied to config.json last
};

// "key=value": value as JSON when it parses (true, 8, null, [1], {"rope_type": "linear"}),
// else as a string.
Status apply_config_set(const std::string& kv, nlohmann::json* config) {
  const size_t eq = kv.find('=');
  if (eq == std::string::npos || eq == 0) {
    return invalid_argument("--config-set " + kv + ": expected KEY=VALUE (VALUE as JSON, e.g. parallel_attn=false)");
  }
  const std::string key = kv.substr(0, eq), value = kv.substr(eq + 1);
  nlohmann::json v = nlohmann::json::parse(value, nullptr, /*allow_exceptions=*/false);
  (*config)[key] = v.is_discarded() ? nlohmann::json(value) : v;
  return Status::ok();
}

Status run(const Options& opt) {
  const ModelShape& m = opt.shape;
  const ArchSpec& arch = *find_row(m.arch);
  nlohmann::json config = make_config(m, arch, opt.dtype);
  for (const std::string& kv : opt.config_sets) TESSERA_RETURN_IF_ERROR(apply_config_set(kv, &config));
  // The written config is read back as the engine reads it, and the tensors follow from
  // that: whatever the loader will ask for is exactly what is written.
  TESSERA_ASSIGN_OR_RETURN(const ModelConfig mc, parse_model_config(config, "generated config.json"));
  const std::vector<ExpectedTensor> specs = expected_tensors(mc);
  const size_t esize = dtype_size(opt.dtype);

  // Plan shards first: every file's header lists its tensors before any data is written.
  std::vector<std::vector<const ExpectedTensor*>> shards(1);
  const double limit = opt.shard_mb * 1e6;
  double in_shard = 0;
  int64_t params = 0;
  for (const auto& s : specs) {
    double bytes = static_cast<double>(numel(s) * esize);
    if (opt.shard_mb > 0 && in_shard > 0 && in_shard + bytes > limit) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(&s);
    in_shard += bytes;
    params += numel(s);
  }

  std::error_code ec;
  fs::create_directories(opt.out, ec);
  if (!fs::is_directory(opt.out)) return invalid_argument("--out " + opt.out + ": cannot create directory");
  // Files of an earlier run would be read as part of this model: remove this tool's own names.
  static const std::regex kOwnFile(
      R"(model(-\d{5}-of-\d{5})?\.safetensors|model\.safetensors\.index\.json|)"
      R"(pytorch_model(-\d{5}-of-\d{5})?\.bin|pytorch_model\.bin\.index\.json)");
  for (const auto& e : fs::directory_iterator(opt.out, ec))
    if (std::regex_match(e.path().filename().string(), kOwnFile)) fs::remove(e.path(), ec);

  {
    std::ofstream cfg(fs::path(opt.out) / "config.json");
    cfg << config.dump(2) << "\n";
    if (!cfg) return invalid_argument(opt.out + "/config.json: write failed");
  }

  nlohmann::json weight_map = nlohmann::json::object();
  uint64_t file_bytes = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    // transformers' names: model-00001-of-00002.safetensors, pytorch_model-00001-of-00002.bin.
    std::string name = opt.torch_bin ? "pytorch_model.bin" : "model.safetensors";
    if (shards.size() > 1) {
      char buf[64];
      std::snprintf(buf, sizeof(buf), opt.torch_bin ? "pytorch_model-%05zu-of-%05zu.bin" : "model-%05zu-of-%05zu.safetensors",
                    i + 1, shards.size());
      name = buf;
    }
    for (const ExpectedTensor* s : shards[i]) weight_map[s->name] = name;
    const std::string path = (fs::path(opt.out) / name).string();
    if (opt.torch_bin) {
      std::vector<TorchZipWriter::Entry> entries;
      for (const ExpectedTensor* s : shards[i]) entries.push_back({s->name, opt.dtype, s->shape});
      TESSERA_ASSIGN_OR_RETURN(auto writer, TorchZipWriter::create(path, entries));
      auto append = [&](const void* d, size_t n) { return writer->append(d, n); };
      for (const ExpectedTensor* s : shards[i]) TESSERA_RETURN_IF_ERROR(write_tensor(append, *s, opt.dtype, opt.seed));
      TESSERA_RETURN_IF_ERROR(writer->finish());
      file_bytes += writer->file_bytes();
    } else {
      std::vector<SafetensorsWriter::Entry> entries;
      for (const ExpectedTensor* s : shards[i]) entries.push_back({s->name, opt.dtype, s->shape});
      TESSERA_ASSIGN_OR_RETURN(auto writer, SafetensorsWriter::create(path, entries));
      auto append = [&](const void* d, size_t n) { return writer->append(d, n); };
      for (const ExpectedTensor* s : shards[i]) TESSERA_RETURN_IF_ERROR(write_tensor(append, *s, opt.dtype, opt.seed));
      TESSERA_RETURN_IF_ERROR(writer->finish());
      file_bytes += writer->file_bytes();
    }
  }
  if (shards.size() > 1) {
    nlohmann::json index;
    index["metadata"]["total_size"] = params * static_cast<int64_t>(esize);
    index["weight_map"] = weight_map;
    const std::string index_name = opt.torch_bin ? "pytorch_model.bin.index.json" : "model.safetensors.index.json";
    std::ofstream out(fs::path(opt.out) / index_name);
    out << index.dump(2) << "\n";
    if (!out) return invalid_argument(opt.out + "/" + index_name + ": write failed");
  }
  TESSERA_LOG_INFO("{}: {} parameters, {} bytes ({}, {} file{}) -> {}", m.arch, params, file_bytes,
                   dtype_name(opt.dtype), shards.size(), shards.size() > 1 ? "s" : "", opt.out);
  return Status::ok();
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  using namespace tessera;
  init_logging("make-ckpt");
  CLI::App app{"Writes a random-weight checkpoint of any architecture in the table (" + row_names() +
               ") in Hugging Face layout"};
  Options opt;
  ModelShape& m = opt.shape;
  std::string preset = "tiny", dtype = "float32";
  std::vector<std::string> names;
  for (const ArchSpec& spec : arch_specs()) names.push_back(spec.name);
  auto* arch_opt = app.add_option("--arch", m.arch, "architecture (a row of the table); required unless --pad-from (default: none)")
                       ->check(CLI::IsMember(names));
  PaddingOptions pad;
  auto* pad_from = app.add_option("--pad-from", pad.from,
                                  "instead of random weights, a padded copy of this trained model: --layers decoder "
                                  "layers whose attention output and MLP down projections are zero and an MLP --ffn "
                                  "wide whose extra units feed zero weights, so it computes the same logits at any size "
                                  "(dense models with gate/up/down MLPs); with --out, --dtype and --seed only (default: none)");
  RandomLoraOptions lora;
  auto* lora_of = app.add_option("--lora-of", lora.base,
                                 "instead of a model, a random PEFT LoRA adapter of this model (adapter_config.json, "
                                 "adapter_model.safetensors); with --out, --dtype, --seed and the --lora-* flags only "
                                 "(default: none)");
  app.add_option("--lora-rank", lora.rank, "--lora-of: the adapter's rank r")->capture_default_str();
  app.add_option("--lora-alpha", lora.alpha, "--lora-of: lora_alpha (scale alpha / r)")->capture_default_str();
  app.add_option("--lora-targets", lora.targets,
                 "--lora-of: target_modules, comma-separated module names (q_proj,v_proj) or all-linear")
      ->delimiter(',')
      ->capture_default_str();
  app.add_flag("--lora-rslora", lora.rslora, "--lora-of: use_rslora (scale alpha / sqrt(r))");
  app.add_option("--out", opt.out, "output folder (created if missing)")->required();
  app.add_option("--preset", preset,
                 "tiny (hidden 64, 2 layers, 4 heads, 2 KV heads, ffn 128, vocab 512, 2048 positions, 4 experts, "
                 "top-k 2) or 100m (hidden 768, 12 layers, 12 heads, 4 KV heads, ffn 2048, vocab 32000, 4096 "
                 "positions, 8 experts, top-k 2); the shape flags below override it")
      ->capture_default_str()
      ->check(CLI::IsMember({"tiny", "100m"}));
  auto* hidden = app.add_option("--hidden", m.hidden, "hidden size (default: the preset's)");
  auto* layers = app.add_option("--layers", m.layers, "decoder layers (default: the preset's)");
  auto* heads = app.add_option("--heads", m.heads, "attention heads (default: the preset's)");
  auto* kv_heads = app.add_option("--kv-heads", m.kv_heads,
                                  "KV heads (default: the preset's; = --heads for architectures without GQA)");
  auto* ffn = app.add_option("--ffn", m.ffn,
                             "MLP width, also of each expert (bloom: must be 4 * hidden) (default: the preset's, or the "
                             "architecture's multiple of --hidden)");
  auto* vocab = app.add_option("--vocab", m.vocab, "vocabulary size (default: the preset's)");
  auto* experts = app.add_option("--experts", m.experts, "MoE architectures only (default: the preset's)");
  auto* top_k = app.add_option("--top-k", m.top_k, "experts per token, MoE architectures only (default: the preset's)");
  auto* max_pos = app.add_option("--max-positions", m.max_positions,
                                 "max_position_embeddings, not for ALiBi (bloom) (default: the preset's)");
  auto* theta = app.add_option("--rope-theta", m.rope_theta,
                               "rotary architectures only (default: the architecture's usual base)");
  app.add_flag("--tie-embeddings", m.tie, "no LM head tensor (always so for bloom)");
  app.add_option("--dtype", dtype, "float32 | float16 | bfloat16")
      ->capture_default_str()
      ->check(CLI::IsMember({"float32", "float16", "bfloat16"}));
  app.add_option("--seed", opt.seed, "seed of the random weights")->capture_default_str();
  app.add_option("--shard-mb", opt.shard_mb,
                 "split into shards of at most this many MB (10^6 bytes) + index; 0 = one file")
      ->capture_default_str();
  std::string format = "safetensors";
  app.add_option("--format", format,
                 "safetensors (model*.safetensors) | bin (pytorch_model*.bin, torch.save's zip format)")
      ->capture_default_str()
      ->check(CLI::IsMember({"safetensors", "bin"}));
  app.add_option("--config-set", opt.config_sets,
                 "KEY=VALUE written into config.json (VALUE as JSON); the tensors follow the edited config, e.g. "
                 "--config-set new_decoder_architecture=false (repeatable) (default: none)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  if (lora_of->count() > 0) {
    for (const CLI::Option* o : app.get_options()) {
      const std::string n = o->get_name();
      if (o->count() > 0 && n.rfind("--lora-", 0) != 0 && n != "--out" && n != "--dtype" && n != "--seed") {
        TESSERA_LOG_ERROR("{} does not apply to --lora-of (which takes --out, --dtype, --seed and --lora-*)", n);
        return 2;
      }
    }
    lora.out = opt.out;
    lora.dtype = *parse_dtype(dtype);
    lora.seed = opt.seed;
    const Status written = write_random_lora(lora);
    if (!written.is_ok()) {
      TESSERA_LOG_ERROR("{}", written.to_string());
      return 1;
    }
    TESSERA_LOG_INFO("LoRA adapter of {} (rank {}, {} target name(s)) -> {}", lora.base, lora.rank, lora.targets.size(),
                     lora.out);
    return 0;
  }
  for (const CLI::Option* o : app.get_options()) {
    const std::string n = o->get_name();
    if (o->count() > 0 && n.rfind("--lora-", 0) == 0) {
      TESSERA_LOG_ERROR("{} applies only to --lora-of", n);
      return 2;
    }
  }
  if (pad_from->count() > 0) {
    for (const CLI::Option* o : app.get_options()) {
      const std::string n = o->get_name();
      if (o->count() > 0 && n != "--pad-from" && n != "--out" && n != "--layers" && n != "--ffn" && n != "--dtype" &&
          n != "--seed") {
        TESSERA_LOG_ERROR("{} does not apply to --pad-from (which takes --out, --layers, --ffn, --dtype, --seed)", n);
        return 2;
      }
    }
    if (layers->count() == 0 || ffn->count() == 0) {
      TESSERA_LOG_ERROR("--pad-from needs --layers and --ffn (the copy's depth and MLP width)");
      return 2;
    }
    pad.out = opt.out;
    pad.layers = m.layers;
    pad.ffn = m.ffn;
    pad.dtype = *parse_dtype(dtype);
    pad.seed = opt.seed;
    const Status padded = write_padded_copy(pad);
    if (!padded.is_ok()) {
      TESSERA_LOG_ERROR("{}", padded.to_string());
      return 1;
    }
    return 0;
  }
  if (arch_opt->count() == 0) {
    TESSERA_LOG_ERROR("--arch is required (or --pad-from MODEL for a padded copy)");
    return 2;
  }
  // The preset gives defaults; explicit flags win.
  ModelShape given = m;
  const ArchSpec& arch = *find_row(m.arch);
  const bool no_gqa = arch.keys.kv_heads.empty();
  ModelShape base;
  if (preset == "100m") {
    base.hidden = 768, base.layers = 12, base.heads = 12, base.kv_heads = 4, base.ffn = 2048, base.vocab = 32000;
    base.experts = 8, base.max_positions = 4096;
  }
  if (no_gqa) base.kv_heads = base.heads;
  if (arch.keys.ffn.empty()) base.ffn = arch.ffn_multiple * base.hidden;
  auto pick = [](CLI::Option* o, int64_t v, int64_t dflt) { return o->count() ? v : dflt; };
  m.hidden = pick(hidden, given.hidden, base.hidden);
  m.layers = pick(layers, given.layers, base.layers);
  m.heads = pick(heads, given.heads, base.heads);
  m.kv_heads = pick(kv_heads, given.kv_heads, no_gqa ? m.heads : base.kv_heads);
  m.ffn = pick(ffn, given.ffn, arch.keys.ffn.empty() ? arch.ffn_multiple * m.hidden : base.ffn);
  m.vocab = pick(vocab, given.vocab, base.vocab);
  m.experts = pick(experts, given.experts, base.experts);
  m.top_k = pick(top_k, given.top_k, base.top_k);
  m.max_positions = pick(max_pos, given.max_positions, base.max_positions);
  m.rope_theta = theta->count() ? given.rope_theta : arch.rope_theta;
  Status flags = Status::ok();
  if (!arch.moe && (experts->count() || top_k->count()))
    flags = invalid_argument("--experts and --top-k apply only to MoE architectures, not " + arch.name);
  if (arch.position == PositionKind::kAlibi && (max_pos->count() || theta->count()))
    flags = invalid_argument("--max-positions and --rope-theta do not apply to " + arch.name + " (ALiBi)");
  if (arch.position == PositionKind::kLearned && theta->count())
    flags = invalid_argument("--rope-theta does not apply to " + arch.name + " (learned positions)");
  if (arch.name == "bloom") m.tie = true;  // BLOOM has no lm_head: always tied
  if (opt.shard_mb < 0) flags = invalid_argument("--shard-mb must not be negative");
  if (flags.is_ok()) flags = validate(m, arch);
  if (!flags.is_ok()) {
    TESSERA_LOG_ERROR("{}", flags.message());
    return 2;
  }
  opt.dtype = *parse_dtype(dtype);
  opt.torch_bin = format == "bin";
  Status st = run(opt);
  if (!st.is_ok()) {
    TESSERA_LOG_ERROR("{}", st.to_string());
    return 1;
  }
  return 0;
}
