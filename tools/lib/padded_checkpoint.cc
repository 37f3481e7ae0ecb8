#include "tools/lib/padded_checkpoint.h"

#include <cmath>
#include <filesystem>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "common/checkpoint.h"
#include "common/logging.h"
#include "common/safetensors_writer.h"
#include "common/splitmix64.h"
#include "worker/arch_tensors.h"
#include "worker/model_checkpoint.h"
#include "worker/model_config.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

int64_t count(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// N(0, 0.02) from (seed, name, index): inert weights of the units and layers added.
void fill_random(std::vector<float>& v, size_t from, uint64_t seed, const std::string& name) {
  uint64_t s = seed ^ std::hash<std::string>{}(name);
  for (size_t i = from; i < v.size(); ++i) {
    const double u1 = (static_cast<double>(splitmix64(s + 2 * i) >> 11) + 1.0) * 0x1.0p-53;
    const double u2 = static_cast<double>(splitmix64(s + 2 * i + 1) >> 11) * 0x1.0p-53;
    v[i] = static_cast<float>(0.02 * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
}

// The source's config.json with the copy's depth and width under the row's own key names.
StatusOr<nlohmann::json> padded_config(const Checkpoint& ckpt, const ModelConfig& mc, const PaddingOptions& o) {
  nlohmann::json config = ckpt.config();
  const ConfigKeys& keys = mc.arch->keys;
  auto set_first_present = [&](const std::vector<std::string>& aliases, int64_t value, const char* what) -> Status {
    for (const std::string& k : aliases) {
      if (config.contains(k)) {
        config[k] = value;
        return Status::ok();
      }
    }
    return invalid_argument(ckpt.config_source() + ": no " + what + " key to set");
  };
  TESSERA_RETURN_IF_ERROR(set_first_present(keys.layers, o.layers, "layer count"));
  TESSERA_RETURN_IF_ERROR(set_first_present(keys.ffn, o.ffn, "MLP width"));
  config["torch_dtype"] = dtype_name(o.dtype);
  return config;
}

// One tensor of the copy, as f32: the source's where it exists (widened for the MLP), inert
// values where it is new.
StatusOr<std::vector<float>> padded_tensor(const Checkpoint& ckpt, const ModelConfig& src, const ExpectedTensor& t,
                                           uint64_t seed) {
  std::vector<float> out(static_cast<size_t>(count(t.shape)), 0.0f);
  const TensorInfo* info = ckpt.find(t.name);
  const bool output_proj = t.role == TensorRole::kO || t.role == TensorRole::kDown;
  if (info == nullptr) {  // a layer added
    if (t.kind == ExpectedTensor::Kind::kNorm) std::fill(out.begin(), out.end(), 1.0f);
    if (t.kind == ExpectedTensor::Kind::kMatrix && !output_proj) fill_random(out, 0, seed, t.name);
    return out;  // output projections and biases: zero
  }
  TESSERA_ASSIGN_OR_RETURN(Tensor have, ckpt.load(t.name, DType::kF32));
  const float* data = have.data<float>();
  if (info->shape == t.shape) {
    std::copy_n(data, out.size(), out.begin());
    return out;
  }
  const bool gate_or_up = t.role == TensorRole::kGate || t.role == TensorRole::kUp;
  if (gate_or_up && !info->shape.empty() && info->shape[0] == src.ffn) {
    // [ffn, ...] -> [F, ...]: the source's rows, then new units (zero biases).
    std::copy_n(data, count(info->shape), out.begin());
    if (t.kind == ExpectedTensor::Kind::kMatrix) fill_random(out, static_cast<size_t>(count(info->shape)), seed, t.name);
    return out;
  }
  if (t.role == TensorRole::kDown && t.kind == ExpectedTensor::Kind::kMatrix && info->shape.size() == 2 &&
      info->shape[1] == src.ffn) {
    // [hidden, ffn] -> [hidden, F]: the new units' columns stay zero.
    for (int64_t r = 0; r < t.shape[0]; ++r)
      std::copy_n(data + r * src.ffn, src.ffn, out.begin() + r * t.shape[1]);
    return out;
  }
  return invalid_argument(ckpt.config_dir() + ": tensor " + t.name + " is " + shape_string(info->shape) +
                          ", which cannot be padded to " + shape_string(t.shape));
}

Status refuse_unpaddable(const ModelConfig& mc, const std::string& source) {
  const ArchSpec& a = *mc.arch;
  if (a.moe) return invalid_argument(source + ": " + a.name + " has routed experts; only dense models can be padded");
  if (a.mlp != MlpKind::kGated || a.name_of(TensorRole::kGate).empty() || a.conv1d_weights)
    return invalid_argument(source + ": " + a.name +
                            "'s MLP is not separate gate / up / down linear layers; only those can be widened");
  for (const LayerSpec& l : mc.layer) {
    if (l.window != mc.layer[0].window || l.local_rope != mc.layer[0].local_rope || l.attn_scale != mc.layer[0].attn_scale)
      return invalid_argument(source + ": its layers differ (sliding windows or rotary bases by layer); only models "
                                       "whose layers are alike can be padded");
  }
  return Status::ok();
}

}  // namespace

Status write_padded_copy(const PaddingOptions& o) {
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, open_model_checkpoint(o.from));
  TESSERA_ASSIGN_OR_RETURN(const ModelConfig src, parse_model_config(ckpt->config(), ckpt->config_source()));
  TESSERA_RETURN_IF_ERROR(refuse_unpaddable(src, o.from));
  if (o.layers < src.layers)
    return invalid_argument("--layers " + std::to_string(o.layers) + " is fewer than the " + std::to_string(src.layers) +
                            " layers of " + o.from);
  if (o.ffn < src.ffn)
    return invalid_argument("--ffn " + std::to_string(o.ffn) + " is narrower than the " + std::to_string(src.ffn) +
                            " of " + o.from);
  TESSERA_ASSIGN_OR_RETURN(nlohmann::json config, padded_config(*ckpt, src, o));
  TESSERA_ASSIGN_OR_RETURN(const ModelConfig padded, parse_model_config(config, "the padded config.json"));
  const std::vector<ExpectedTensor> specs = expected_tensors(padded);

  std::error_code ec;
  fs::create_directories(o.out, ec);
  if (!fs::is_directory(o.out)) return invalid_argument("--out " + o.out + ": cannot create directory");
  if (fs::equivalent(o.out, ckpt->config_dir(), ec)) return invalid_argument("--out must not be the source folder");
  // The tokenizer and generation files travel with the copy; weights and config do not.
  for (const auto& e : fs::directory_iterator(ckpt->config_dir(), ec)) {
    const std::string name = e.path().filename().string();
    if (!e.is_regular_file() || name == "config.json" || name.find("safetensors") != std::string::npos ||
        name.find(".bin") != std::string::npos || name.find(".gguf") != std::string::npos)
      continue;
    fs::copy_file(e.path(), fs::path(o.out) / name, fs::copy_options::overwrite_existing, ec);
    if (ec) return invalid_argument("--out " + o.out + ": cannot copy " + name + ": " + ec.message());
  }
  {
    std::ofstream out(fs::path(o.out) / "config.json");
    out << config.dump(2) << "\n";
    if (!out) return invalid_argument(o.out + "/config.json: write failed");
  }
  std::vector<SafetensorsWriter::Entry> entries;
  for (const ExpectedTensor& t : specs) entries.push_back({t.name, o.dtype, t.shape});
  TESSERA_ASSIGN_OR_RETURN(auto writer, SafetensorsWriter::create((fs::path(o.out) / "model.safetensors").string(), entries));
  std::vector<uint8_t> converted;
  for (const ExpectedTensor& t : specs) {
    TESSERA_ASSIGN_OR_RETURN(const std::vector<float> values, padded_tensor(*ckpt, src, t, o.seed));
    converted.resize(values.size() * dtype_size(o.dtype));
    convert_elements(values.data(), DType::kF32, converted.data(), o.dtype, values.size());
    TESSERA_RETURN_IF_ERROR(writer->write(t.name, converted.data(), converted.size()));
  }
  TESSERA_RETURN_IF_ERROR(writer->finish());
  TESSERA_LOG_INFO("{}: {} layers (was {}), MLP width {} (was {}), {} bytes ({}) -> {}", o.from, o.layers, src.layers,
                   o.ffn, src.ffn, writer->file_bytes(), dtype_name(o.dtype), o.out);
  return Status::ok();
}

}  // namespace tessera
