#pragma once
// A copy of the model folder `model` (config.json and model.safetensors) in a new temporary
// folder, its safetensors header padded with spaces (as the format allows) so that the data
// starts on 64 bytes, as Tessera's own files do: the same weights, so the same goldens, in the
// layout Tessera writes (the fixtures start theirs elsewhere; a weight budget streams both from
// the file as stored, worker/checkpoint_backing.h).
#include <cstdint>
#include <cstring>
#include <string>

#include "tests/test_support.h"

namespace tessera::testing {

inline std::string copy_with_data_on_64_bytes(const std::string& model) {
  const std::string to = make_temp_dir("tessera-data-on-64");
  write_file(to + "/config.json", read_file(model + "/config.json"));
  const std::string file = read_file(model + "/model.safetensors");
  uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  std::string header = file.substr(8, n);
  header.append((64 - (8 + header.size()) % 64) % 64, ' ');
  const uint64_t padded = header.size();
  write_file(to + "/model.safetensors",
             std::string(reinterpret_cast<const char*>(&padded), 8) + header + file.substr(8 + n));
  return to;
}

}  // namespace tessera::testing
