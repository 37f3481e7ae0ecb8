#include "tools/lib/random_lora.h"

#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "common/checkpoint.h"
#include "common/safetensors_writer.h"
#include "worker/lora_adapter.h"
#include "worker/model_checkpoint.h"
#include "worker/model_config.h"

namespace tessera {

Status write_random_lora(const RandomLoraOptions& o) {
  if (o.rank < 1) return invalid_argument("--lora-rank: at least 1, got " + std::to_string(o.rank));
  if (o.targets.empty()) return invalid_argument("--lora-targets: name at least one module (or all-linear)");
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> base, open_model_checkpoint(o.base));
  TESSERA_ASSIGN_OR_RETURN(ModelConfig config, parse_model_config(base->config(), base->config_source()));
  nlohmann::json adapter_config = {
      {"peft_type", "LORA"},      {"task_type", "CAUSAL_LM"},   {"base_model_name_or_path", o.base},
      {"r", o.rank},              {"lora_alpha", o.alpha},      {"use_rslora", o.rslora},
      {"lora_dropout", 0.0},      {"bias", "none"},             {"fan_in_fan_out", config.arch->conv1d_weights},
      {"use_dora", false},        {"modules_to_save", nullptr}, {"inference_mode", true},
      {"target_modules", o.targets.size() == 1 && o.targets[0] == "all-linear" ? nlohmann::json("all-linear")
                                                                                : nlohmann::json(o.targets)}};
  TESSERA_ASSIGN_OR_RETURN(const LoraAdapterConfig parsed, parse_lora_adapter_config(adapter_config, "--lora-targets"));
  std::vector<LoraTargetModule> chosen;
  for (LoraTargetModule& m : lora_target_modules(*base, config))
    if (parsed.targets(m.name)) chosen.push_back(std::move(m));
  if (chosen.empty()) {
    return invalid_argument("--lora-targets: no linear layer of " + o.base + " (" + config.arch->name +
                            ") is named by " + adapter_config["target_modules"].dump());
  }
  std::vector<SafetensorsWriter::Entry> entries;
  for (const LoraTargetModule& m : chosen) {
    entries.push_back({"base_model.model." + m.name + ".lora_A.weight", o.dtype, {o.rank, m.in}});
    entries.push_back({"base_model.model." + m.name + ".lora_B.weight", o.dtype, {m.out, o.rank}});
  }
  std::error_code ec;
  std::filesystem::create_directories(o.out, ec);
  if (ec) return invalid_argument("--out: cannot create " + o.out + ": " + ec.message());
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsWriter> writer,
                           SafetensorsWriter::create(o.out + "/adapter_model.safetensors", entries));
  std::mt19937_64 rng(o.seed);
  std::vector<float> values;
  std::vector<uint8_t> stored;
  for (const SafetensorsWriter::Entry& e : entries) {
    const bool is_a = e.name.find(".lora_A.") != std::string::npos;
    std::uniform_real_distribution<float> u(-(is_a ? o.a_scale : o.b_scale), is_a ? o.a_scale : o.b_scale);
    values.resize(static_cast<size_t>(e.shape[0] * e.shape[1]));
    for (float& v : values) v = u(rng);
    stored.resize(values.size() * dtype_size(o.dtype));
    convert_elements(values.data(), DType::kF32, stored.data(), o.dtype, values.size());
    TESSERA_RETURN_IF_ERROR(writer->write(e.name, stored.data(), stored.size()));
  }
  TESSERA_RETURN_IF_ERROR(writer->finish());
  std::ofstream config_file(o.out + "/adapter_config.json");
  config_file << adapter_config.dump(2) << "\n";
  if (!config_file) return invalid_argument("--out: cannot write " + o.out + "/adapter_config.json");
  return Status::ok();
}

}  // namespace tessera
