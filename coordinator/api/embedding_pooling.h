#pragma once
// How a served model turns its final hidden states into one embedding: the pooling (last
// token, mean, CLS) and whether the vector is L2-normalised. Decided once at start-up from
// model.pooling / model.normalize, or ("auto") from the model folder's sentence-transformers
// files as SentenceTransformer would load them: modules.json lists the modules, the Pooling
// one's config.json (1_Pooling/) says the mode, a Normalize module normalises. Anything those
// files ask that Tessera does not compute (max or weighted-mean pooling, a Dense projection,
// include_prompt false) is refused by name rather than served differently.
#include <string>

#include "common/status.h"
#include "common/step_plan.h"

namespace tessera {

struct EmbeddingPooling {
  Pooling pooling = Pooling::kLast;
  bool normalize = true;
  int embedding_size = 0;  // the model's hidden size: the vector's length (0 = unchecked)
  // Where each choice came from, for the start-up log ("model.pooling", "1_Pooling/config.json",
  // "the default for decoder models").
  std::string pooling_source;
  std::string normalize_source;
};

// `model_dir`: the model's folder (a checkpoint file's folder for GGUF / DeepSpeed JSON);
// `pooling`: auto | last | mean | cls; `normalize`: auto | true | false. InvalidArgument naming
// the file and field for sentence-transformers files it cannot honour.
StatusOr<EmbeddingPooling> embedding_pooling(const std::string& model_dir, const std::string& pooling,
                                             const std::string& normalize);

// "last", "mean", "cls" (and "none").
const char* pooling_name(Pooling pooling);

}  // namespace tessera
