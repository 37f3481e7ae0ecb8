#include "worker/weight_cache.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <ctime>
#include <cstring>
#include <filesystem>

#include "common/fnv1a.h"
#include "common/parallel_roles.h"
#include "common/wire/wire_buffer.h"

namespace tessera {
namespace {

constexpr char kCacheMagic[8] = {'T', 'S', 'W', 'C', 'A', 'C', 'H', 'E'};
constexpr size_t kFooterBytes = 24;  // JSON length, checksum, magic

std::string hex16(uint64_t v) {
  char s[17];
  std::snprintf(s, sizeof(s), "%016llx", static_cast<unsigned long long>(v));
  return s;
}

std::string canonical(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::weakly_canonical(path, ec);
  return ec ? path : p.string();
}

nlohmann::json file_stamp(const std::string& path) {
  struct stat st {};
  nlohmann::json f = {{"path", canonical(path)}, {"bytes", -1}, {"modified_ns", -1}};
  if (::stat(path.c_str(), &st) == 0) {
    f["bytes"] = static_cast<int64_t>(st.st_size);
    f["modified_ns"] = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  }
  return f;
}

bool read_all_at(int fd, void* to, size_t bytes, size_t offset) {
  char* p = static_cast<char*>(to);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd, p, bytes, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    bytes -= static_cast<size_t>(n);
    offset += static_cast<size_t>(n);
  }
  return true;
}

// The first key of `a` or `b` whose values differ, as "key" or "key.sub".
std::string first_difference(const nlohmann::json& a, const nlohmann::json& b, const std::string& prefix = "") {
  if (!a.is_object() || !b.is_object()) return a == b ? "" : prefix;
  for (const auto& [key, value] : a.items()) {
    const std::string name = prefix.empty() ? key : prefix + "." + key;
    if (!b.contains(key)) return name;
    std::string d = first_difference(value, b[key], name);
    if (!d.empty()) return d;
  }
  for (const auto& [key, value] : b.items())
    if (!a.contains(key)) return prefix.empty() ? key : prefix + "." + key;
  return "";
}

// "11321008 bytes, modified 2026-12-05 23:16:58.661633753 UTC"
std::string stamp_text(const nlohmann::json& f) {
  const int64_t ns = f.value("modified_ns", int64_t{-1});
  const time_t seconds = static_cast<time_t>(ns / 1000000000);
  struct tm utc {};
  char when[64] = "an unknown time";
  if (ns >= 0 && ::gmtime_r(&seconds, &utc) != nullptr) {
    char day[32];
    std::strftime(day, sizeof(day), "%Y-%m-%d %H:%M:%S", &utc);
    std::snprintf(when, sizeof(when), "%s.%09lld UTC", day, static_cast<long long>(ns % 1000000000));
  }
  return std::to_string(f.value("bytes", int64_t{-1})) + " bytes, modified " + when;
}

}  // namespace

nlohmann::json weight_cache_identity(const Checkpoint& checkpoint, const WeightLoadOptions& o, WeightStreaming streaming) {
  nlohmann::json files = nlohmann::json::array();
  for (const auto& f : checkpoint.files()) files.push_back(file_stamp(f->path()));
  if (!checkpoint.from_gguf()) files.push_back(file_stamp(checkpoint.config_source()));
  nlohmann::json plan = nullptr;
  if (o.plan != nullptr) {
    plan = nlohmann::json::object();
    for (const auto& [name, role] : o.plan->roles) plan[name] = tp_role_name(role);
  }
  nlohmann::json rules = nlohmann::json::array();
  for (const QuantRuleConfig& r : o.quant.rules) rules.push_back({r.match, weight_quantization_name(r.quantize)});
  nlohmann::json layout = {
      {"dtype", dtype_name(o.dtype)},
      {"kernel_inject", o.kernel_inject},
      {"rank", o.shard.rank},
      {"world", o.shard.world},
      {"tp_plan", plan},
      {"quantization", {{"kind", weight_quantization_name(o.quant.kind)}, {"group", o.quant.group}, {"rules", rules}}},
      {"bf16_coding", bf16_coding_name(o.quant.bf16_coding)},
      {"int8_layout", o.int8_layout == Int8WeightLayout::kCpuPanels ? "cpu panels" : "rows"},
      {"lm_head", o.lm_head},
      // map starts units on pages, read and direct on 2 MiB (worker/weight_spill.h).
      {"unit_alignment", streaming == WeightStreaming::kMap ? "page" : "huge page"},
  };
  return {{"format", kWeightCacheFormat},
          {"model", canonical(checkpoint.path())},
          {"files", files},
          {"layout", layout}};
}

std::string weight_cache_file_name(const nlohmann::json& identity) {
  const std::string model = identity.value("model", "");
  std::string stem = std::filesystem::path(model).filename().string();
  if (stem.empty()) stem = "model";
  for (char& c : stem)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') c = '_';
  const nlohmann::json& layout = identity.at("layout");
  const std::string format = std::to_string(identity.value("format", 0));
  return stem + "-" + hex16(fnv1a64(model + "\n" + format + "\n" + layout.dump())) + "-rank" +
         std::to_string(layout.value("rank", 0)) + "of" + std::to_string(layout.value("world", 1)) + ".tessera-weights";
}

std::string weight_cache_difference(const nlohmann::json& written, const nlohmann::json& ours) {
  const auto array_of_objects = [](const nlohmann::json& j, const char* key) {
    if (!j.contains(key) || !j[key].is_array()) return false;
    for (const auto& e : j[key])
      if (!e.is_object()) return false;
    return true;
  };
  if (!written.contains("format") || !written["format"].is_number_integer()) return "written in an unknown form";
  if (written.value("format", -1) != ours.value("format", -1)) {
    return "written by cache format " + written.value("format", nlohmann::json(nullptr)).dump() +
           " (this build reads and writes format " + std::to_string(kWeightCacheFormat) + ")";
  }
  if (!written.contains("model") || !written["model"].is_string() || !array_of_objects(written, "files") ||
      !written.contains("layout") || !written["layout"].is_object()) {
    return "written in an unknown form";
  }
  if (written.value("model", "") != ours.value("model", "")) {
    return "written for the model at '" + written.value("model", "") + "'";
  }
  const nlohmann::json& wf = written["files"];
  const nlohmann::json& of = ours["files"];
  if (wf.size() != of.size()) return "written for another set of checkpoint files (" + wf.dump() + ")";
  for (size_t i = 0; i < wf.size(); ++i) {
    if (wf[i] == of[i]) continue;
    if (wf[i].value("path", "") != of[i].value("path", "")) {
      return "written for the checkpoint file '" + wf[i].value("path", "") + "', not '" + of[i].value("path", "") + "'";
    }
    return "written when '" + of[i].value("path", "") + "' had " + stamp_text(wf[i]) + "; it has " +
           stamp_text(of[i]) + " now (the model changed since)";
  }
  const std::string key = first_difference(written["layout"], ours["layout"]);
  return key.empty() ? "" : "written with another " + key;
}

std::string encode_weight_cache_trailer(const nlohmann::json& contents) {
  std::string out = contents.dump();
  const uint64_t length = out.size(), sum = fnv1a64(out);
  {
    wire::WireWriter w(&out);
    w.u64(length);
    w.u64(sum);
  }
  out.append(kCacheMagic, sizeof(kCacheMagic));
  return out;
}

StatusOr<WeightCacheTrailer> read_weight_cache_trailer(int fd, size_t file_bytes) {
  char footer[kFooterBytes];
  if (file_bytes < kFooterBytes || !read_all_at(fd, footer, kFooterBytes, file_bytes - kFooterBytes) ||
      std::memcmp(footer + 16, kCacheMagic, sizeof(kCacheMagic)) != 0) {
    return invalid_argument("is not a Tessera weight cache file (no trailer: cut short, or another program's)");
  }
  wire::WireReader in(std::string_view(footer, 16));
  const uint64_t length = in.u64("trailer length"), sum = in.u64("trailer checksum");
  if (length > file_bytes - kFooterBytes) return invalid_argument("is damaged (its trailer claims more than the file)");
  std::string text(length, '\0');
  if (!read_all_at(fd, text.data(), length, file_bytes - kFooterBytes - length)) {
    return invalid_argument(std::string("cannot be read: ") + std::strerror(errno));
  }
  if (fnv1a64(text) != sum) return invalid_argument("is damaged (its trailer's checksum does not match)");
  WeightCacheTrailer t;
  t.contents = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!t.contents.is_object() || !t.contents.contains("identity") || !t.contents["identity"].is_object() ||
      !t.contents.contains("units") || !t.contents["units"].is_object() || !t.contents.contains("layers") ||
      !t.contents["layers"].is_number_integer()) {
    return invalid_argument("is damaged (its trailer is not the JSON a cache file holds)");
  }
  t.data_end = file_bytes - kFooterBytes - length;
  return t;
}

nlohmann::json weight_cache_tensor(const Tensor& t, const char* base) {
  if (t.empty()) return nullptr;
  const TensorView& v = t.view();
  nlohmann::json shape = nlohmann::json::array();
  for (int d = 0; d < v.ndim; ++d) shape.push_back(v.shape[static_cast<size_t>(d)]);
  return {static_cast<int>(v.dtype), shape, v.stride0, static_cast<const char*>(v.data) - base};
}

StatusOr<TensorView> weight_cache_view(const nlohmann::json& r, char* base, size_t begin, size_t end) {
  auto bad = [] { return invalid_argument("is damaged (a tensor's record is not one)"); };
  if (!r.is_array() || r.size() != 4 || !r[0].is_number_integer() || !r[1].is_array() ||
      !r[2].is_number_integer() || !r[3].is_number_integer())
    return bad();
  const int dtype = r[0].get<int>();
  if (dtype < 0 || dtype > static_cast<int>(DType::kI8) || r[1].empty() || r[1].size() > kMaxTensorDims) return bad();
  TensorView v;
  v.dtype = static_cast<DType>(dtype);
  v.ndim = static_cast<int>(r[1].size());
  // Sizes are bounded before anything multiplies them: no record makes an extent overflow.
  constexpr int64_t kMost = int64_t{1} << 40;
  unsigned __int128 row = 1;
  for (size_t d = 0; d < r[1].size(); ++d) {
    if (!r[1][d].is_number_integer() || r[1][d].get<int64_t>() < 0 || r[1][d].get<int64_t>() > kMost) return bad();
    v.shape[d] = r[1][d].get<int64_t>();
    if (d > 0) row *= static_cast<unsigned __int128>(v.shape[d]);
  }
  v.stride0 = r[2].get<int64_t>();
  const int64_t offset = r[3].get<int64_t>();
  if (row > static_cast<unsigned __int128>(kMost) || v.stride0 < 0 || v.stride0 > kMost || offset < 0 || offset > kMost ||
      (v.stride0 > 0 && v.stride0 < static_cast<int64_t>(row)))
    return bad();
  // Elements from the first to past the last: whole rows apart, the last row dense.
  const unsigned __int128 extent =
      v.shape[0] == 0 ? 0
                      : static_cast<unsigned __int128>(v.shape[0] - 1) * static_cast<unsigned __int128>(v.row_stride()) + row;
  const unsigned __int128 last = static_cast<unsigned __int128>(offset) + extent * dtype_size(v.dtype);
  if (static_cast<size_t>(offset) < begin || last > static_cast<unsigned __int128>(end)) {
    return invalid_argument("is damaged (a tensor lies outside its unit's bytes)");
  }
  v.data = base + offset;
  return v;
}

nlohmann::json weight_cache_fields(LayerWeights& lw) {
  nlohmann::json linears = nlohmann::json::array();
  for_each_layer_linear(lw, [&](LinearWeights& l) {
    nlohmann::json rows = nlohmann::json::array();
    for (const LinearSource::Rows& r : l.source.rows) rows.push_back({r.weight, r.begin, r.count});
    linears.push_back({l.ggml_blocks, rows, l.source.in_begin, l.source.in_count});
  });
  nlohmann::json expert_split = nlohmann::json::array();
  for (const bool s : lw.expert_split) expert_split.push_back(s);
  return {{"attn_split", lw.attn_split}, {"mlp_split", lw.mlp_split},     {"expert_split", expert_split},
          {"shared_split", lw.shared_split}, {"experts", lw.experts.size()}, {"linears", linears}};
}

Status restore_weight_cache_fields(const nlohmann::json& f, LayerWeights* lw) {
  auto bad = [] { return invalid_argument("is damaged (a layer's fields are not ones)"); };
  if (!f.is_object() || !f.value("experts", nlohmann::json()).is_number_unsigned() ||
      !f.value("expert_split", nlohmann::json()).is_array() || !f.value("linears", nlohmann::json()).is_array())
    return bad();
  const size_t experts = f["experts"].get<size_t>();
  if (experts > 4096) return bad();
  for (const char* key : {"attn_split", "mlp_split", "shared_split"})
    if (!f.contains(key) || !f[key].is_boolean()) return bad();
  lw->attn_split = f["attn_split"].get<bool>();
  lw->mlp_split = f["mlp_split"].get<bool>();
  lw->shared_split = f["shared_split"].get<bool>();
  lw->expert_split.clear();
  for (const auto& s : f["expert_split"]) {
    if (!s.is_boolean()) return bad();
    lw->expert_split.push_back(s.get<bool>());
  }
  lw->experts.resize(experts);
  const nlohmann::json& linears = f["linears"];
  size_t i = 0;
  Status status = Status::ok();
  for_each_layer_linear(*lw, [&](LinearWeights& l) {
    if (!status.is_ok()) return;
    if (i >= linears.size()) {
      status = bad();
      return;
    }
    const nlohmann::json& r = linears[i++];
    if (!r.is_array() || r.size() != 4 || !r[0].is_number_integer() || !r[1].is_array() ||
        !r[2].is_number_integer() || !r[3].is_number_integer()) {
      status = bad();
      return;
    }
    l.ggml_blocks = r[0].get<int32_t>();
    l.source = LinearSource{};
    for (const auto& row : r[1]) {
      if (!row.is_array() || row.size() != 3 || !row[0].is_string() || !row[1].is_number_integer() ||
          !row[2].is_number_integer()) {
        status = bad();
        return;
      }
      l.source.rows.push_back({row[0].get<std::string>(), row[1].get<int64_t>(), row[2].get<int64_t>()});
    }
    l.source.in_begin = r[2].get<int64_t>();
    l.source.in_count = r[3].get<int64_t>();
  });
  if (status.is_ok() && i != linears.size()) return bad();
  return status;
}

}  // namespace tessera
