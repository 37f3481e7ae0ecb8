#include "worker/weight_reader.h"

#include <algorithm>
#include <cstring>

#include "common/gguf/ggml_block_element.h"
#include "common/gguf/gguf_file.h"
#include "common/logging.h"
#include "worker/weight_quantization.h"

namespace tessera::weight_loading {
namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

Status shape_mismatch(const std::string& name, const std::vector<int64_t>& stored, const std::vector<int64_t>& expected) {
  return invalid_argument("tensor \"" + name + "\" has shape " + shape_str(stored) + " but config.json implies " +
                          shape_str(expected));
}

// How many outer dimensions of 1 `expected` has beyond a GGUF tensor's `stored` shape, or -1
// when they differ otherwise. GGUF writers list a tensor's dimensions up to its last one
// above 1 (ggml_n_dims): llama.cpp's converter writes Qwen2-MoE's [1, hidden] shared-expert
// gate as two dimensions, llama-quantize writes it again as one.
int dropped_outer_ones(const std::vector<int64_t>& stored, const std::vector<int64_t>& expected) {
  if (stored.size() > expected.size()) return -1;
  const size_t extra = expected.size() - stored.size();
  for (size_t i = 0; i < extra; ++i) {
    if (expected[i] != 1) return -1;
  }
  return std::equal(stored.begin(), stored.end(), expected.begin() + static_cast<std::ptrdiff_t>(extra))
             ? static_cast<int>(extra)
             : -1;
}

// The index of the first NaN or Inf (all exponent bits set) of a float tensor; -1 when it
// has none or is not a float32/16 or bfloat16 tensor.
int64_t first_non_finite(const Tensor& t) {
  auto scan = [&t](auto bits_of, auto mask) -> int64_t {
    const auto* p = t.data<const decltype(mask)>();
    for (int64_t i = 0, n = t.numel(); i < n; ++i) {
      if ((bits_of(p[i]) & mask) == mask) return i;
    }
    return -1;
  };
  if (!t.view().contiguous()) return -1;
  switch (t.dtype()) {
    case DType::kF32:
      return scan([](uint32_t b) { return b; }, uint32_t{0x7f800000});
    case DType::kF16:
      return scan([](uint16_t b) { return b; }, uint16_t{0x7c00});
    case DType::kBF16:
      return scan([](uint16_t b) { return b; }, uint16_t{0x7f80});
    default:
      return -1;
  }
}

}  // namespace

void add_segment(std::vector<RowSegment>& segs, const std::string& name, int64_t out, int64_t begin, int64_t count) {
  if (!segs.empty() && segs.back().name == name && segs.back().begin + segs.back().count == begin) {
    segs.back().count += count;
    return;
  }
  segs.push_back({name, out, begin, count});
}

Tensor transpose(const Tensor& t) {
  const int64_t a = t.dim(0), b = t.dim(1);
  const size_t es = dtype_size(t.dtype());
  Tensor out = Tensor::zeros({b, a}, t.dtype());
  const char* src = t.data<char>();
  char* dst = out.data<char>();
  for (int64_t i = 0; i < a; ++i) {
    for (int64_t j = 0; j < b; ++j) std::memcpy(dst + (j * a + i) * es, src + (i * b + j) * es, es);
  }
  return out;
}

std::string WeightReader::resolve(const std::string& names) const {
  const std::vector<std::string> alts = name_alternatives(names);
  for (const std::string& n : alts) {
    if (ckpt_.find(n) != nullptr) return n;
  }
  return alts[0];
}

StatusOr<Tensor> WeightReader::load_as(const std::string& name, const std::vector<int64_t>& shape, Slice slice,
                                       DType dtype, bool read_whole) {
  const TensorInfo* info = ckpt_.find(name);
  if (info == nullptr) return not_found("checkpoint has no tensor \"" + name + "\"");
  // An unsupported dtype is reported by name before the shape is compared.
  if (!info->dtype_supported) return ckpt_.load(name, dtype).status();
  const int dropped = info->ggml_type >= 0 ? dropped_outer_ones(info->shape, shape) : 0;
  if (info->shape != shape && dropped <= 0) return shape_mismatch(name, info->shape, shape);
  // A slice of an outer dimension of 1 the file left out is the whole tensor.
  const int axis = slice.axis < 0 ? -1 : slice.axis - dropped;
  StatusOr<Tensor> t = axis < 0 ? ckpt_.load(name, dtype) : ckpt_.load_slice(name, dtype, axis, slice.begin, slice.count);
  if (!t.is_ok()) return t.status();
  if (dropped > 0) t->mutable_view() = TensorView(t->data<void>(), t->dtype(), shape);
  const char* mapped = static_cast<const char*>(info->data);
  const char* got = t->data<const char>();
  const bool in_mapping = got >= mapped && got < mapped + info->nbytes;
  if (own_copies_ && read_whole && !reshaping_ && t->nbytes() >= kOwnCopyBytes &&
      (in_mapping || t->nbytes() < kHugePageBytes) && !to_be_coded(t->dtype(), t->view().dims())) {
    // Read whole every step: copied out of the file's 4 KiB pages (or a small converted
    // copy's, on the C heap) into memory on huge pages (Tensor::zeros says why).
    Tensor copy = arena_.zeros(t->view().dims(), t->dtype());
    std::memcpy(copy.data<char>(), got, t->nbytes());
    *t = std::move(copy);
    got = t->data<const char>();
  }
  // A converted or sliced copy no longer needs the mapped pages: drop them to keep peak
  // RSS near this rank's share. Copies are also made of strided PyTorch tensors and of
  // storages the legacy format left unaligned, so the test is where the data lives.
  const bool used_in_place = got >= mapped && got < mapped + info->nbytes;
  if (info->dtype != dtype || slice.axis == 1 || !used_in_place) ckpt_.release(name);
  if (check_finite_) {
    if (const int64_t bad = first_non_finite(*t); bad >= 0) {
      return invalid_argument("tensor \"" + name + "\" holds a non-finite value (NaN or Inf) at element " +
                              std::to_string(bad) + (slice.axis < 0 ? "" : " of this rank's slice") + " as " +
                              dtype_name(t->dtype()) + " (model.check_weights)");
    }
    // The scan faulted in every page of a tensor used in place: one read a row at a time (an
    // embedding table) or streamed later (a layer loaded as stored) needs none of them now,
    // and they would stay resident (an embedding table of 49 MB was held whole through a
    // rank's load); a page read again comes back from the page cache.
    if (used_in_place && (!read_whole || !own_copies_)) ckpt_.release(name);
  }
  total_bytes_ += static_cast<int64_t>(t->nbytes());
  return t;
}

StatusOr<Tensor> WeightReader::sparse_table(const std::string& name, int64_t rows, int64_t cols, Slice slice,
                                            int32_t* blocks) {
  *blocks = kept_block_type(name, slice);
  if (*blocks < 0 || !ggml_element::decodes(static_cast<uint32_t>(*blocks))) {
    *blocks = -1;
    return load_sparsely_read(name, {rows, cols}, slice);
  }
  // No scratch: the table outlives the load (a slice of rows is borrowed from the mapping).
  return blocks_matrix(name, rows, cols, slice, nullptr);
}

Status WeightReader::norm(const std::string& names, int64_t size, NormKind kind, float offset, Tensor* w, Tensor* b) {
  const std::string name = resolve(names);
  TESSERA_ASSIGN_OR_RETURN(Tensor g, load_as(name, {size}, {}, DType::kF32));
  if (offset != 0.0f) {
    Tensor copy = Tensor::zeros({size}, DType::kF32);
    for (int64_t i = 0; i < size; ++i) copy.data<float>()[i] = g.data<float>()[i] + offset;
    g = std::move(copy);
  }
  *w = std::move(g);
  if (kind == NormKind::kLayerNorm) {
    TESSERA_ASSIGN_OR_RETURN(*b, load_as(bias_name(name), {size}, {}, DType::kF32));
  }
  return Status::ok();
}

StatusOr<Tensor> WeightReader::matrix(const std::string& name, int64_t out, int64_t in, Slice slice) {
  if (!conv1d_) return load(name, {out, in}, slice);
  const Slice stored = slice.axis < 0 ? slice : Slice{1 - slice.axis, slice.begin, slice.count};
  const Reshaping transposed(this);
  TESSERA_ASSIGN_OR_RETURN(Tensor t, load(name, {in, out}, stored));
  Tensor flipped = transpose(t);
  ckpt_.release(name);
  return flipped;
}

template <typename Load>
StatusOr<LinearWeights> WeightReader::blocks_or(const std::string& name, int64_t out, int64_t in, Slice slice,
                                                Load load) {
  LinearWeights l;
  const int32_t blocks = kept_block_type(name, slice);
  if (blocks >= 0) {
    TESSERA_ASSIGN_OR_RETURN(l.w, blocks_matrix(name, out, in, slice, &scratch_));
    l.ggml_blocks = blocks;
  } else {
    TESSERA_ASSIGN_OR_RETURN(l.w, load());
  }
  return l;
}

StatusOr<LinearWeights> WeightReader::linear(const std::string& weight_name, int64_t out, int64_t in, Slice slice,
                                             bool add_bias) {
  TESSERA_ASSIGN_OR_RETURN(LinearWeights l, blocks_or(weight_name, out, in, slice,
                                                      [&] { return matrix(weight_name, out, in, slice); }));
  if (slice.axis == 0) {
    l.source.rows.push_back({weight_name, slice.begin, slice.count});
  } else {
    l.source.rows.push_back({weight_name, 0, out});
    if (slice.axis == 1) {
      l.source.in_begin = slice.begin;
      l.source.in_count = slice.count;
    }
  }
  if (add_bias) {
    const Slice bias_slice = slice.axis == 0 ? slice : Slice{};
    TESSERA_ASSIGN_OR_RETURN(l.b, load_optional(bias_name(weight_name), {out}, bias_slice));
  }
  return l;
}

StatusOr<LinearWeights> WeightReader::lm_head(const std::string& weight_name, int64_t vocab, int64_t hidden,
                                              Slice slice) {
  TESSERA_ASSIGN_OR_RETURN(LinearWeights l, blocks_or(weight_name, vocab, hidden, slice,
                                                      [&] { return load(weight_name, {vocab, hidden}, slice); }));
  TESSERA_ASSIGN_OR_RETURN(l.b, load_optional(bias_name(weight_name), {vocab}, slice));
  return l;
}

StatusOr<LinearWeights> WeightReader::gather(const std::vector<RowSegment>& segs, int64_t in) {
  if (segs.size() == 1) {
    const RowSegment& s = segs[0];
    return linear(s.name, s.out, in, s.count == s.out ? Slice{} : rows(s.begin, s.count));
  }
  std::vector<LinearWeights> parts;
  int64_t total = 0;
  const Reshaping stacked(this);
  // Kept as blocks only when every part is, of one type (a q4_K_M file stores some
  // layers' V as q6_K beside a q4_K Q and K: that QKV is decoded).
  const KeepingBlocks keep(this, same_kept_blocks(segs));
  for (const RowSegment& s : segs) {
    TESSERA_ASSIGN_OR_RETURN(LinearWeights p, linear(s.name, s.out, in, rows(s.begin, s.count)));
    if (!parts.empty() && p.b.empty() != parts[0].b.empty()) {
      return invalid_argument("tensor \"" + bias_name(s.name) + "\": biases must be present for all or none of " +
                              segs[0].name + " and " + s.name);
    }
    total += s.count;
    parts.push_back(std::move(p));
  }
  LinearWeights packed;
  const int64_t width = parts[0].w.dim(1);  // `in`, or the bytes of a row of blocks
  // Kept blocks become panels (or are decoded) within the layer: their stacked copy is scratch.
  const bool scratch = parts[0].ggml_blocks >= 0 || to_be_coded(parts[0].w.dtype(), {total, width});
  packed.w = scratch                    ? scratch_.take({total, width}, parts[0].w.dtype())
             : own_copies_             ? arena_.zeros({total, width}, parts[0].w.dtype())
                                       : Tensor::zeros({total, width}, parts[0].w.dtype());
  packed.ggml_blocks = parts[0].ggml_blocks;
  for (const RowSegment& s : segs) packed.source.rows.push_back({s.name, s.begin, s.count});
  char* dst = packed.w.data<char>();
  for (const LinearWeights& p : parts) {
    std::memcpy(dst, p.w.data<char>(), p.w.nbytes());
    dst += p.w.nbytes();
  }
  if (!parts[0].b.empty()) {
    packed.b = Tensor::zeros({total}, parts[0].b.dtype());
    char* bdst = packed.b.data<char>();
    for (const LinearWeights& p : parts) {
      std::memcpy(bdst, p.b.data<char>(), p.b.nbytes());
      bdst += p.b.nbytes();
    }
  }
  // Counted once as the packed copy; the parts are freed here.
  for (const LinearWeights& p : parts) total_bytes_ -= static_cast<int64_t>(p.w.nbytes() + (p.b.empty() ? 0 : p.b.nbytes()));
  total_bytes_ += static_cast<int64_t>(packed.w.nbytes() + (packed.b.empty() ? 0 : packed.b.nbytes()));
  for (const RowSegment& s : segs) release_linear(s.name);
  return packed;
}

void WeightReader::release_linear(const std::string& weight_name) {
  ckpt_.release(weight_name);
  if (ckpt_.find(bias_name(weight_name)) != nullptr) ckpt_.release(bias_name(weight_name));
}

bool WeightReader::mixed_blocks(const std::vector<RowSegment>& segs) const {
  bool any = false;
  for (const RowSegment& s : segs) any |= kept_block_type(s.name) >= 0;
  return any && !same_kept_blocks(segs);
}

int32_t WeightReader::kept_block_type(const std::string& name, Slice slice) const {
  if (keep_blocks_ == KeptBlocks::kNo || conv1d_) return -1;
  const TensorInfo* info = ckpt_.find(name);
  if (info == nullptr || info->shape.size() != 2 || info->value_offset != 0.0f) return -1;
  const auto type = static_cast<GgmlType>(info->ggml_type);
  const bool auto_kind = keep_blocks_ == KeptBlocks::kWhereAligned;
  if (info->ggml_type < 0 || !kept_as_blocks(type, auto_kind)) return -1;
  const int64_t block = ggml_type_traits(static_cast<uint32_t>(info->ggml_type))->block_elems;
  if (slice.axis == 1 && (slice.begin % block != 0 || slice.count % block != 0) &&
      keep_blocks_ == KeptBlocks::kWhereAligned) {
    if (!split_blocks_warned_) {
      TESSERA_LOG_WARN("model.quantization auto: \"{}\" is split at inputs [{}, {}), inside its {}-input {} "
                       "blocks; this rank decodes it (int8) instead of keeping its blocks as panels (so for every "
                       "matrix split inside its blocks: the load summary counts them as int8)",
                       name, slice.begin, slice.begin + slice.count, block, ggml_type_name(info->ggml_type));
      split_blocks_warned_ = true;
    }
    return -1;
  }
  return info->ggml_type;
}

bool WeightReader::same_kept_blocks(const std::vector<RowSegment>& segs) const {
  const int32_t first = kept_block_type(segs[0].name);
  for (const RowSegment& s : segs) {
    if (kept_block_type(s.name) != first || first < 0) return false;
  }
  return true;
}

StatusOr<Tensor> WeightReader::blocks_matrix(const std::string& name, int64_t out, int64_t in, Slice slice,
                                             RecycledBuffers* scratch) {
  const TensorInfo* info = ckpt_.find(name);
  if (info->shape != std::vector<int64_t>{out, in}) return shape_mismatch(name, info->shape, {out, in});
  TESSERA_ASSIGN_OR_RETURN(Tensor t, ckpt_.load_blocks(name, slice.axis, slice.begin, slice.count, scratch));
  // A copy (a slice of inputs, reordered rows) leaves the mapped pages unused; borrowed rows
  // are released once packed (quantize_model_weights).
  const char* mapped = static_cast<const char*>(info->data);
  if (t.data<const char>() < mapped || t.data<const char>() >= mapped + info->nbytes) ckpt_.release(name);
  total_bytes_ += static_cast<int64_t>(t.nbytes());
  return t;
}

}  // namespace tessera::weight_loading
