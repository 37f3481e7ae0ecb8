#pragma once
// The checkpoint side of weight loading (worker/model_weights.cc): WeightReader reads tensors,
// or this rank's slice of them, by name, checking their shapes, keeping ggml blocks where they
// are to become panels, copying what is used in place onto huge pages, and scanning for NaN/Inf.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/checkpoint.h"
#include "common/recycled_buffers.h"
#include "common/tensor.h"
#include "common/tensor_arena.h"
#include "kernels/coded_bf16.h"
#include "worker/arch_spec.h"
#include "worker/model_weights.h"

namespace tessera::weight_loading {

// A part of a tensor: rows (axis 0) or columns (axis 1) [begin, begin + count); axis -1 is
// the whole tensor.
struct Slice {
  int axis = -1;
  int64_t begin = 0;
  int64_t count = 0;
};
inline Slice rows(int64_t begin, int64_t count) { return {0, begin, count}; }
inline Slice cols(int64_t begin, int64_t count) { return {1, begin, count}; }

// Rows [begin, begin + count) of the logical [out, in] weight `name` (whose full row count
// is `out`): one piece of a gathered matrix.
struct RowSegment {
  std::string name;
  int64_t out = 0;
  int64_t begin = 0;
  int64_t count = 0;
};

// Appends a segment, merging it into the previous one when it continues it.
void add_segment(std::vector<RowSegment>& segs, const std::string& name, int64_t out, int64_t begin, int64_t count);

// [a, b] -> [b, a] for any element size (GPT-2's Conv1D weights are stored [in, out]).
Tensor transpose(const Tensor& t);

// Which ggml-block matrices the reader keeps as blocks (kept_as_blocks): none; every 4-bit one
// (model.quantization int4); or every kind a kernel computes from as stored (q4_*, q5_*, q6_K
// as panels, q8_0 as int8) whose tensor-parallel split falls on block boundaries (auto on a
// GGUF file).
enum class KeptBlocks { kNo, kAlways, kWhereAligned };

// Reads tensors (or this rank's slice of them) by name, checking each against the shape
// config.json implies, so a mismatched checkpoint fails with the tensor's name rather than
// garbage output. Linear weights are addressed in the logical [out, in] layout whatever
// their storage (conv1d: stored [in, out]).
class WeightReader {
 public:
  // codes_bf16: every linear weight left in bfloat16 is to be coded within its layer
  // (model.bf16_coding; worker/weight_quantization.h), so a bf16 matrix the coding takes is
  // read in place (no own copy) and a stacked one is recycled scratch.
  WeightReader(const Checkpoint& ckpt, DType dtype, bool conv1d, bool own_copies, KeptBlocks keep_blocks,
               bool check_finite, bool codes_bf16 = false)
      : ckpt_(ckpt),
        dtype_(dtype),
        conv1d_(conv1d),
        own_copies_(own_copies),
        check_finite_(check_finite),
        codes_bf16_(codes_bf16),
        keep_blocks_(keep_blocks) {}

  // While an AsStored(true) lives, no own copies are made: what is stored in the model
  // dtype stays in the mapping (a layer streamed from the checkpoint file).
  struct AsStored {
    AsStored(WeightReader* r, bool as_stored) : r_(r), was_(r->own_copies_) {
      if (as_stored) r->own_copies_ = false;
    }
    ~AsStored() { r_->own_copies_ = was_; }
    WeightReader* r_;
    bool was_;
  };

  // The first alternative of a "a|b" name the checkpoint has (the first one when none).
  std::string resolve(const std::string& names) const;
  bool has(const std::string& name) const { return ckpt_.find(name) != nullptr; }

  StatusOr<Tensor> load(const std::string& name, const std::vector<int64_t>& shape, Slice slice = {}) {
    return load_as(name, shape, slice, dtype_);
  }
  // A table read a few rows at a time (an embedding not tied to the LM head): stays in the
  // mapping where it can, so only the rows used become resident.
  StatusOr<Tensor> load_sparsely_read(const std::string& name, const std::vector<int64_t>& shape, Slice slice = {}) {
    return load_as(name, shape, slice, dtype_, /*read_whole=*/false);
  }

  StatusOr<Tensor> load_as(const std::string& name, const std::vector<int64_t>& shape, Slice slice, DType dtype,
                           bool read_whole = true);

  // An embedding table read a row per token: kept in its GGUF file's quantized blocks (in
  // the mapping, so only the rows used become resident; Backend::embedding_ggml decodes
  // them) where this reader keeps a linear weight's blocks, else as load_sparsely_read reads
  // it. *blocks: the ggml type kept, or -1.
  StatusOr<Tensor> sparse_table(const std::string& name, int64_t rows, int64_t cols, Slice slice, int32_t* blocks);

  // Optional tensors (biases): empty when the checkpoint lacks them.
  StatusOr<Tensor> load_optional(const std::string& name, const std::vector<int64_t>& shape, Slice slice = {}) {
    if (ckpt_.find(name) == nullptr) return Tensor();
    return load(name, shape, slice);
  }

  // A norm's gamma (and beta for LayerNorm), always in float32: norms are tiny, and
  // Gemma's (1 + w) must be formed before any rounding to 16 bits.
  Status norm(const std::string& names, int64_t size, NormKind kind, float offset, Tensor* w, Tensor* b);

  // Logical rows `slice` (axis 0) or columns (axis 1) of a linear [out, in] weight.
  StatusOr<Tensor> matrix(const std::string& name, int64_t out, int64_t in, Slice slice);

  // A linear layer [out, in]. Column-parallel: `slice` takes rows, and the bias the same
  // rows. Row-parallel: `slice` takes columns; the bias is added once, by the rank with
  // `add_bias`, before the partial sums are all-reduced.
  StatusOr<LinearWeights> linear(const std::string& weight_name, int64_t out, int64_t in, Slice slice = {},
                                 bool add_bias = true);

  // The LM head [vocab, hidden] (`slice` its vocabulary rows), stored so in every checkpoint
  // (GPT-2's is a Linear, not a Conv1D), kept as blocks as linear() keeps them.
  StatusOr<LinearWeights> lm_head(const std::string& weight_name, int64_t vocab, int64_t hidden, Slice slice);

  // The rows of several segments stacked into one [sum of counts, in] matrix (a fused QKV
  // or gate|up, or this rank's heads of one), biases likewise (all present or all absent).
  StatusOr<LinearWeights> gather(const std::vector<RowSegment>& segs, int64_t in);

  // After a tensor was copied (packed, reordered), its mapped pages can go.
  void release_linear(const std::string& weight_name);

  int64_t total_bytes() const { return total_bytes_; }
  DType dtype() const { return dtype_; }

  // Whether the segments' tensors would be kept as blocks of more than one type, or some as
  // blocks and some not (a q4_K_M file stores some layers' V as q6_K beside a q4_K Q and K):
  // stacked into one matrix they would all be decoded.
  bool mixed_blocks(const std::vector<RowSegment>& segs) const;

 private:
  // A linear weight [out, in] (`slice` of it) as the blocks it is stored in when they are to
  // be kept (kept_block_type), else as `load` reads it.
  template <typename Load>
  StatusOr<LinearWeights> blocks_or(const std::string& name, int64_t out, int64_t in, Slice slice, Load load);

  // The ggml type of `name` when it is to be read as blocks (panels asked for, a matrix of a
  // type panel_scheme_of_blocks takes, not transposed on the way); -1 otherwise. A tensor-parallel split of its
  // inputs that falls inside a block is refused by the loader (Checkpoint::load_blocks) when
  // int4 was asked for; under auto that matrix is decoded instead, and the log says so.
  int32_t kept_block_type(const std::string& name, Slice slice = {}) const;

  bool same_kept_blocks(const std::vector<RowSegment>& segs) const;

  // A kept matrix's rows as blocks, the shape checked as load_as does (a kept matrix is stored
  // with both dimensions: kept_block_type keeps no other).
  // `scratch` takes the rows that must be copied (a row order, a slice of inputs): this
  // reader's recycled scratch for what is packed within its layer, nullptr for a tensor kept
  // as it is read (the embedding table).
  StatusOr<Tensor> blocks_matrix(const std::string& name, int64_t out, int64_t in, Slice slice,
                                 RecycledBuffers* scratch);

  // While a KeepingBlocks(false) lives, kept types are decoded like any other.
  struct KeepingBlocks {
    KeepingBlocks(WeightReader* r, bool keep) : r_(r), was_(r->keep_blocks_) {
      if (!keep) r->keep_blocks_ = KeptBlocks::kNo;
    }
    ~KeepingBlocks() { r_->keep_blocks_ = was_; }
    WeightReader* r_;
    KeptBlocks was_;
  };

  // From this size on a tensor is given its own copy when own_copies_: any that would be
  // used in place, and converted ones below a huge page (larger ones already are on them).
  static constexpr size_t kOwnCopyBytes = size_t{64} << 10;
  TensorArena arena_;
  // The copies of kept ggml blocks (a fused matrix's parts stacked, rows put back in order),
  // each read once by the packer and dropped with its layer; and the stacked bf16 matrices
  // the coding reads once.
  RecycledBuffers scratch_;
  // While set, loads are reshaped into a new tensor (stacked, transposed) right after: no
  // own copy of the parts (arena memory is freed only with the whole chunk).
  bool reshaping_ = false;
  struct Reshaping {
    explicit Reshaping(WeightReader* r) : r_(r), was_(r->reshaping_) { r->reshaping_ = true; }
    ~Reshaping() { r_->reshaping_ = was_; }
    WeightReader* r_;
    bool was_;
  };
  const Checkpoint& ckpt_;
  DType dtype_;
  bool conv1d_;
  bool own_copies_;  // WeightLoadOptions::own_copies
  bool check_finite_;  // WeightLoadOptions::check_finite
  bool codes_bf16_;
  // Whether a tensor of this dtype and shape is one the coding will replace within its layer.
  bool to_be_coded(DType dtype, const std::vector<int64_t>& dims) const {
    return codes_bf16_ && bf16_matrix_codable(dtype, dims);
  }
  KeptBlocks keep_blocks_;
  // A split inside a matrix's blocks was logged: said once per load, not per matrix (a MoE
  // model has one per expert and layer).
  mutable bool split_blocks_warned_ = false;
  int64_t total_bytes_ = 0;
};

}  // namespace tessera::weight_loading
