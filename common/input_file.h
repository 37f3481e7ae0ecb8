#pragma once
// Files a user hands Tessera at start-up (the YAML configuration, config.json, tokenizer
// and chat-template files, DeepSpeed JSONs, key files) are read through these, so that no
// such file can hang or exhaust the process: only regular files are read (a FIFO would
// block forever, /dev/zero would grow a buffer without end), the read is bounded, and every
// failure is one line that names the file and what is wrong with it (a symlink loop, a
// directory, a device, too large, unreadable).
#include <cstddef>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace tessera {

// 64 MiB: larger than any configuration or tokenizer file in use (the largest tokenizer.json
// files, of 256k-token vocabularies, are about 35 MB).
inline constexpr size_t kMaxInputFileBytes = size_t{64} << 20;

// What kind of thing `path` names, for messages: "a directory", "a FIFO", "a character
// device", ...; empty for a regular file.
std::string describe_non_regular(unsigned mode);

// Reads the whole of a regular file. `what` names the file's role in the message
// ("the configuration file", "config.json"); errors:
//   not_found         the path (or a symlink's target) does not exist
//   invalid_argument  a symlink loop, a directory, a FIFO, a device or socket, a file
//                     over `max_bytes`
//   data_loss         a read error
StatusOr<std::string> read_input_file(const std::string& path, const std::string& what,
                                      size_t max_bytes = kMaxInputFileBytes);

// read_input_file, parsed as JSON: InvalidArgument "PATH: WHAT is not valid JSON: ..." when it
// is not.
StatusOr<nlohmann::json> read_input_json(const std::string& path, const std::string& what);

// The first `max_bytes` bytes (fewer when the file is shorter) of a regular file, with the
// same refusals: to tell a file's format by its first bytes.
StatusOr<std::string> read_input_file_head(const std::string& path, const std::string& what, size_t max_bytes);

// Whether `path` names something (std::filesystem::exists without its exception: a symlink
// loop or a permission error is reported as such rather than as "no such file").
// Ok(true)/Ok(false) for present/absent; an error for anything else, naming `path`.
StatusOr<bool> input_path_exists(const std::string& path);

}  // namespace tessera
