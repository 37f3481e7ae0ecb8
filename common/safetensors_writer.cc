#include "common/safetensors_writer.h"

#include <cerrno>
#include <cstring>
#include <set>

#include <nlohmann/json.hpp>

#include "common/safetensors.h"

namespace tessera {

StatusOr<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::create(
    const std::string& path, std::vector<Entry> entries, const std::map<std::string, std::string>& metadata) {
  // ordered_json keeps "__metadata__" first and the tensors in declaration (= data) order.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = std::move(meta);
  }
  std::set<std::string> seen;
  std::vector<uint64_t> ends;
  uint64_t offset = 0;
  for (const auto& e : entries) {
    if (e.name.empty() || e.name == "__metadata__")
      return invalid_argument(path + ": invalid tensor name '" + e.name + "'");
    if (!seen.insert(e.name).second) return invalid_argument(path + ": tensor '" + e.name + "' declared twice");
    uint64_t nbytes = dtype_size(e.dtype);
    for (int64_t d : e.shape) {
      if (d < 0) return invalid_argument(path + ": tensor '" + e.name + "' has a negative dimension");
      nbytes *= static_cast<uint64_t>(d);
    }
    nlohmann::ordered_json t;
    t["dtype"] = safetensors_dtype_name(e.dtype);
    t["shape"] = e.shape;
    t["data_offsets"] = {offset, offset + nbytes};
    header[e.name] = std::move(t);
    offset += nbytes;
    ends.push_back(offset);
  }
  std::string text = header.dump();
  // Padded with spaces (the format allows it) so that the data starts on 64 bytes: a reader
  // that maps the file then finds each tensor whose offset is a multiple of 64 aligned as a
  // copy would be, and its kernels can compute from the mapping (worker/checkpoint_backing.h).
  text.append((64 - (8 + text.size()) % 64) % 64, ' ');

  std::unique_ptr<SafetensorsWriter> w(new SafetensorsWriter());
  w->path_ = path;
  w->file_ = std::fopen(path.c_str(), "wb");
  if (w->file_ == nullptr) return invalid_argument(path + ": cannot create: " + std::strerror(errno));
  w->entries_ = std::move(entries);
  w->ends_ = std::move(ends);
  w->data_start_ = 8 + text.size();
  w->total_data_ = offset;

  unsigned char len[8];
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  if (std::fwrite(len, 1, 8, w->file_) != 8 || std::fwrite(text.data(), 1, text.size(), w->file_) != text.size())
    return internal_error(path + ": write failed: " + std::strerror(errno));
  return w;
}

SafetensorsWriter::~SafetensorsWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

std::string SafetensorsWriter::next_tensor() const {
  return cursor_ < entries_.size() ? entries_[cursor_].name : "";
}

Status SafetensorsWriter::append(const void* data, size_t nbytes) {
  if (file_ == nullptr || finished_) return internal_error(path_ + ": append after finish()");
  if (written_ + nbytes > total_data_) {
    return invalid_argument(path_ + ": " + std::to_string(written_ + nbytes - total_data_) +
                            " bytes more than the declared tensors hold");
  }
  if (nbytes > 0 && std::fwrite(data, 1, nbytes, file_) != nbytes)
    return internal_error(path_ + ": write failed: " + std::strerror(errno));
  written_ += nbytes;
  // Entries wholly written are done; an empty entry at the current position stays pending so
  // that write() can still name it.
  while (cursor_ < ends_.size() && (ends_[cursor_] < written_ || (ends_[cursor_] == written_ && nbytes > 0 &&
                                                                  entry_begin(cursor_) < ends_[cursor_])))
    ++cursor_;
  return Status::ok();
}

Status SafetensorsWriter::write(const std::string& name, const void* data, size_t nbytes) {
  // Empty tensors hold no bytes: skipping past them by name is as good as writing them.
  while (cursor_ < entries_.size() && entries_[cursor_].name != name && entry_begin(cursor_) == ends_[cursor_] &&
         ends_[cursor_] == written_)
    ++cursor_;
  if (cursor_ >= entries_.size()) return invalid_argument(path_ + ": tensor '" + name + "' written after all data");
  if (entries_[cursor_].name != name) {
    return invalid_argument(path_ + ": tensor '" + name + "' written out of order; expected '" +
                            entries_[cursor_].name + "'");
  }
  uint64_t begin = entry_begin(cursor_);
  if (written_ != begin) return invalid_argument(path_ + ": tensor '" + name + "' is partly written already");
  if (nbytes != ends_[cursor_] - begin) {
    return invalid_argument(path_ + ": tensor '" + name + "' needs " + std::to_string(ends_[cursor_] - begin) +
                            " bytes, got " + std::to_string(nbytes));
  }
  TESSERA_RETURN_IF_ERROR(append(data, nbytes));
  if (nbytes == 0) ++cursor_;
  return Status::ok();
}

Status SafetensorsWriter::finish() {
  if (finished_) return Status::ok();
  if (written_ != total_data_) {
    return invalid_argument(path_ + ": finished after " + std::to_string(written_) + " of " +
                            std::to_string(total_data_) + " data bytes (next tensor '" + next_tensor() + "')");
  }
  finished_ = true;
  int rc = std::fclose(file_);
  file_ = nullptr;
  if (rc != 0) return internal_error(path_ + ": closing failed: " + std::strerror(errno));
  return Status::ok();
}

Status write_safetensors(const std::string& path, const std::vector<std::pair<std::string, TensorView>>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsWriter::Entry> entries;
  for (const auto& [name, view] : tensors) entries.push_back({name, view.dtype, view.dims()});
  TESSERA_ASSIGN_OR_RETURN(auto writer, SafetensorsWriter::create(path, std::move(entries), metadata));
  for (const auto& [name, view] : tensors) TESSERA_RETURN_IF_ERROR(writer->write(name, view.data, view.nbytes()));
  return writer->finish();
}

}  // namespace tessera
