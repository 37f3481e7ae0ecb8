// Opening a GGUF file from disk, and joining the parts of a model split by llama.cpp's
// gguf-split: every part is found by name from the first, its split.no checked against its
// place, and its tensors appended to the first part's table (each still pointing into its own
// part's mapping). The metadata is the first part's, as llama.cpp reads it. Also is_gguf_path.
#include <cctype>
#include <filesystem>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>

#include "common/checkpoint/mapped_file.h"
#include "common/gguf/gguf_file.h"
#include "common/gguf/gguf_internal.h"
#include "common/string_util.h"

namespace tessera {
namespace {

// NAME-00001-of-00003.gguf, as llama.cpp's gguf-split names the parts (index is 1-based).
struct GgufSplitName {
  std::string prefix;
  uint64_t index = 0;
  uint64_t count = 0;
};

std::optional<GgufSplitName> gguf_split_name(const std::string& path) {
  static constexpr std::string_view kShape = "-00000-of-00000.gguf";  // '0' stands for any digit
  if (path.size() < kShape.size()) return std::nullopt;
  const std::string_view tail = std::string_view(path).substr(path.size() - kShape.size());
  for (size_t i = 0; i < kShape.size(); ++i) {
    const bool digit = std::isdigit(static_cast<unsigned char>(tail[i])) != 0;
    if (kShape[i] == '0' ? !digit : tail[i] != kShape[i]) return std::nullopt;
  }
  const std::string prefix = path.substr(0, path.size() - kShape.size());
  const auto number = [&](size_t at) { return std::stoull(std::string(tail.substr(at, 5))); };
  return GgufSplitName{prefix, number(1), number(10)};
}

std::string gguf_split_path(const std::string& prefix, uint64_t index, uint64_t count) {
  auto five = [](uint64_t n) {
    std::string s = std::to_string(n);
    return std::string(s.size() < 5 ? 5 - s.size() : 0, '0') + s;
  };
  return prefix + "-" + five(index) + "-of-" + five(count) + ".gguf";
}

struct GgufMappedPart {
  std::unique_ptr<MappedFile> mapping;
  std::unique_ptr<GgufFile> file;
};

StatusOr<GgufMappedPart> gguf_open_part(const std::string& path) {
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> mapping, MappedFile::open(path));
  const auto* bytes = reinterpret_cast<const uint8_t*>(mapping->data());
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::parse(bytes, mapping->size(), path));
  return GgufMappedPart{std::move(mapping), std::move(file)};
}

// 1 for a whole model; the number of parts when `file` is the first part of a split one.
StatusOr<uint64_t> gguf_split_count(const GgufFile& file) {
  if (!file.has("split.count")) return uint64_t{1};
  TESSERA_ASSIGN_OR_RETURN(uint64_t count, file.get_uint("split.count"));
  if (count <= 1) return uint64_t{1};
  const std::optional<GgufSplitName> name = gguf_split_name(file.path());
  if (!name || name->count != count)
    return invalid_argument(file.path() + ": split.count is " + std::to_string(count) +
                            ", but the file name does not end in " + gguf_split_path("", 1, count) +
                            ", so the other parts cannot be found");
  if (name->index != 1)
    return invalid_argument(file.path() + ": part " + std::to_string(name->index) +
                            " of a split model; open its first part, " + gguf_split_path(name->prefix, 1, count));
  return count;
}

// A part's split.no (0-based) must be its place in the name; its split.count the first part's.
Status gguf_check_split_part(const GgufFile& part, uint64_t index, uint64_t count) {
  TESSERA_ASSIGN_OR_RETURN(uint64_t no, part.get_uint("split.no"));
  if (no != index)
    return data_loss(part.path() + ": split.no is " + std::to_string(no) + ", but the file name makes it part " +
                     std::to_string(index + 1) + " of " + std::to_string(count) + " (split.no " +
                     std::to_string(index) + ")");
  if (part.has("split.count")) {
    TESSERA_ASSIGN_OR_RETURN(uint64_t part_count, part.get_uint("split.count"));
    if (part_count != count)
      return data_loss(part.path() + ": split.count is " + std::to_string(part_count) + ", but the first part says " +
                       std::to_string(count));
  }
  return Status::ok();
}

// Opens parts 2..count of the split model whose first part is `first` and appends their
// tensors (which point into their own mapping) and mappings.
Status gguf_join_split_parts(const GgufFile& first, uint64_t count, std::vector<GgufTensor>* tensors,
                             std::vector<std::unique_ptr<MappedFile>>* mappings) {
  TESSERA_RETURN_IF_ERROR(gguf_check_split_part(first, 0, count));
  const std::string prefix = gguf_split_name(first.path())->prefix;
  std::unordered_set<std::string> names;
  for (const GgufTensor& t : *tensors) names.insert(t.name);
  for (uint64_t i = 1; i < count; ++i) {
    const std::string part_path = gguf_split_path(prefix, i + 1, count);
    StatusOr<GgufMappedPart> part = gguf_open_part(part_path);
    if (!part.is_ok() && part.status().code() == StatusCode::kNotFound)
      return not_found(part_path + ": no such file (part " + std::to_string(i + 1) + " of " + std::to_string(count) +
                       " of the split model " + first.path() + ")");
    if (!part.is_ok()) return part.status();
    TESSERA_RETURN_IF_ERROR(gguf_check_split_part(*part->file, i, count));
    for (const GgufTensor& t : part->file->tensors()) {
      if (!names.insert(t.name).second)
        return data_loss(part_path + ": tensor " + gguf_quote(t.name) + " is also in an earlier part of " +
                         first.path());
      tensors->push_back(t);
    }
    mappings->push_back(std::move(part->mapping));
  }
  if (first.has("split.tensors.count")) {
    TESSERA_ASSIGN_OR_RETURN(uint64_t expected, first.get_uint("split.tensors.count"));
    if (expected != tensors->size())
      return data_loss(first.path() + ": split.tensors.count is " + std::to_string(expected) + ", but the " +
                       std::to_string(count) + " parts hold " + std::to_string(tensors->size()) + " tensors");
  }
  return Status::ok();
}

}  // namespace

StatusOr<std::unique_ptr<GgufFile>> GgufFile::open(const std::string& path) {
  TESSERA_ASSIGN_OR_RETURN(GgufMappedPart first, gguf_open_part(path));
  std::unique_ptr<GgufFile> file = std::move(first.file);
  file->parts_.push_back(std::move(first.mapping));
  TESSERA_ASSIGN_OR_RETURN(uint64_t count, gguf_split_count(*file));
  if (count > 1) TESSERA_RETURN_IF_ERROR(gguf_join_split_parts(*file, count, &file->tensors_, &file->parts_));
  return file;
}

bool is_gguf_path(const std::string& path) {
  std::error_code ec;
  return ascii_lower(std::filesystem::path(path).extension().string()) == ".gguf" &&
         !std::filesystem::is_directory(path, ec);
}

}  // namespace tessera
