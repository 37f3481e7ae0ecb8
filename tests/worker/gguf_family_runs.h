// Running a tiny fixture's golden prompts through a model (a folder or a GGUF file made from
// it) and comparing two such runs: shared by the GGUF family tests.
#pragma once

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "tests/test_support.h"
#include "tests/worker/gguf_from_hf.h"
#include "worker/generator.h"
#include "worker/model_config.h"
#include "worker/model_weights.h"
#include "worker/transformer.h"

namespace tessera::testing {

struct FamilyCase {
  std::vector<int32_t> prompt, greedy;
  std::vector<float> logits;  // [greedy.size(), vocab]
};

inline std::vector<FamilyCase> family_goldens(const std::string& model_dir) {
  const nlohmann::json index = nlohmann::json::parse(read_file(model_dir + "/goldens/index.json"));
  std::vector<FamilyCase> cases;
  for (const auto& c : index["cases"]) {
    cases.push_back({c["prompt_ids"].get<std::vector<int32_t>>(), c["greedy_ids"].get<std::vector<int32_t>>(),
                     read_f32_file(model_dir + "/goldens/" + c["logits_file"].get<std::string>())});
  }
  return cases;
}

// Greedy ids and logits of every case, all in one batch, float32 on the CPU.
struct FamilyRun {
  int64_t vocab = 0;
  std::vector<GenerationResult> results;
};

struct FamilyRunOptions {
  int64_t max_context = 0;  // the served context (ModelLoadOptions::max_context; 0 = the model's own)
  // model.quantization; none by default: the file's own values (auto would make q8_0 int8).
  WeightQuantization kind = WeightQuantization::kNone;
  bool kernel_inject = true;  // false: the plain op sequence, q, k, v and gate, up apart
};

inline StatusOr<FamilyRun> run_family(const std::string& path, const std::vector<FamilyCase>& cases,
                                      const FamilyRunOptions& options = {}) {
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, make_backend("cpu"));
  ModelLoadOptions lo;
  lo.dtype = DType::kF32;
  lo.max_context = options.max_context;
  lo.quant.kind = options.kind;
  lo.kernel_inject = options.kernel_inject;
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Transformer> model, Transformer::load(path, lo, *backend));
  Generator gen(*model, *backend);
  std::vector<GenerationRequest> reqs;
  for (const FamilyCase& c : cases) {
    GenerationRequest r;
    r.prompt = c.prompt;
    r.max_new_tokens = static_cast<int>(c.greedy.size());
    reqs.push_back(r);
  }
  FamilyRun run;
  run.vocab = model->config().vocab;
  TESSERA_ASSIGN_OR_RETURN(run.results, gen.generate(reqs, true));
  return run;
}

// The largest logit difference between two runs of the same cases; ids must be equal.
inline float compare_runs(const FamilyRun& got, const FamilyRun& want, const std::string& what) {
  float worst = 0;
  for (size_t i = 0; i < want.results.size(); ++i) {
    EXPECT_EQ(got.results[i].output, want.results[i].output) << what << ", case " << i;
    const std::vector<float>& a = got.results[i].logits;
    const std::vector<float>& b = want.results[i].logits;
    if (a.size() != b.size()) {
      ADD_FAILURE() << what << ", case " << i << ": " << a.size() << " logits against " << b.size();
      continue;
    }
    for (size_t k = 0; k < a.size(); ++k) worst = std::max(worst, std::fabs(a[k] - b[k]));
  }
  return worst;
}

inline std::string write_gguf(const GgufConversion& conv, const std::string& dir, const std::string& name) {
  const std::string path = dir + "/" + name + ".gguf";
  write_file(path, conv.writer.build());
  return path;
}

// `ckpt`'s weights as one rank loads them under model.quantization auto, int8 stored in rows
// (what a device backend reads); `kernel_inject` false keeps q, k, v and gate, up apart.
// `rank` of `world`: that rank's shard (the built-in tensor-parallel split).
inline StatusOr<ModelWeights> load_weights_auto(const Checkpoint& ckpt, bool kernel_inject = true, int rank = 0,
                                                int world = 1) {
  TESSERA_ASSIGN_OR_RETURN(ModelConfig config, parse_model_config(ckpt.config(), ckpt.config_source()));
  WeightLoadOptions o;
  o.quant.kind = WeightQuantization::kAuto;
  o.int8_layout = Int8WeightLayout::kRows;
  o.kernel_inject = kernel_inject;
  TESSERA_ASSIGN_OR_RETURN(o.shard, ShardSpec::make(config, rank, world));
  return load_model_weights(ckpt, config, o);
}

}  // namespace tessera::testing
