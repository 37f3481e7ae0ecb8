// Teacher-forced logits of llama.cpp on one id sequence: every position's row, float32 LE, for
// tools/reference/check_gguf_llamacpp.py. Built by that script against a llama.cpp build
// (LLAMA_CPP_DIR), not by Tessera's CMake. f32 KV cache and no flash attention, so the
// attention adds as little rounding of its own as Tessera's float32 path does.
// usage: llamacpp_logits MODEL.gguf N_CTX id,id,... OUT.f32 [ADAPTER.gguf]
// ADAPTER.gguf: a LoRA adapter file applied at scale 1 (its alpha / r inside, llama.cpp's rule).
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "llama.h"

int main(int argc, char** argv) {
  if (argc != 5 && argc != 6) {
    std::fprintf(stderr, "usage: %s MODEL.gguf N_CTX id,id,... OUT.f32 [ADAPTER.gguf]\n", argv[0]);
    return 2;
  }
  std::vector<llama_token> ids;
  std::stringstream list(argv[3]);
  for (std::string id; std::getline(list, id, ',');) ids.push_back(std::atoi(id.c_str()));
  llama_backend_init();
  llama_model* model = llama_model_load_from_file(argv[1], llama_model_default_params());
  if (model == nullptr) return 1;
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = static_cast<uint32_t>(std::atoi(argv[2]));
  cp.n_batch = cp.n_ubatch = cp.n_ctx;
  cp.n_threads = cp.n_threads_batch = 2;
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  cp.type_k = cp.type_v = GGML_TYPE_F32;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (ctx == nullptr) return 1;
  if (argc == 6) {
    llama_adapter_lora* adapter = llama_adapter_lora_init(model, argv[5]);
    float scale = 1.0f;
    if (adapter == nullptr || llama_set_adapters_lora(ctx, &adapter, 1, &scale) != 0) return 1;
  }
  llama_batch batch = llama_batch_init(static_cast<int32_t>(ids.size()), 0, 1);
  for (size_t i = 0; i < ids.size(); ++i) {
    batch.token[i] = ids[i];
    batch.pos[i] = static_cast<llama_pos>(i);
    batch.n_seq_id[i] = 1;
    batch.seq_id[i][0] = 0;
    batch.logits[i] = 1;
  }
  batch.n_tokens = static_cast<int32_t>(ids.size());
  if (llama_decode(ctx, batch) != 0) return 1;
  const int32_t vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  std::FILE* out = std::fopen(argv[4], "wb");
  if (out == nullptr) return 1;
  for (size_t i = 0; i < ids.size(); ++i) {
    std::fwrite(llama_get_logits_ith(ctx, static_cast<int32_t>(i)), sizeof(float), static_cast<size_t>(vocab), out);
  }
  std::fclose(out);
  llama_batch_free(batch);
  llama_free(ctx);
  llama_model_free(model);
  return 0;
}
