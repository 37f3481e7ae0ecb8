#pragma once
// Files holding secrets (server.http.api_keys_file): read only when nobody but their owner
// could have read them too. The check is made on the opened file (fstat of the descriptor,
// so what is checked is what is read), which is a symlink's final target: a Kubernetes Secret
// volume's `key -> ..data/key` links are followed and the mode its `defaultMode` gave the
// real file is what counts.
//
// The rule (PostgreSQL's for its server key, for the same reason):
//   - no permission at all for others (mode & 0007 == 0);
//   - owned by this process's user: no group permission either (0600 or 0400);
//   - owned by root: group read allowed, nothing else (0640, 0440): root-managed secrets
//     readable through a group, which is what Kubernetes does with fsGroup (its Secret files
//     become root:<fsGroup> 0440 even with defaultMode: 0400);
//   - owned by anyone else: refused.
#include <sys/stat.h>

#include <string>
#include <vector>

#include "common/status.h"

namespace tessera {

// Whether a file of this owner and mode may hold secrets for a process running as `euid`;
// the error says what is wrong and how to fix it (`what` and `path` start it).
Status check_secret_file_mode(const struct stat& st, uid_t euid, const std::string& what, const std::string& path);

// Reads a secret file after check_secret_file_mode.
StatusOr<std::string> read_secret_file(const std::string& path, const std::string& what);

// server.http.api_keys_file: one key per line; surrounding spaces and tabs (and a CR of
// CRLF files) are dropped; blank lines and lines whose first non-blank character is '#' are
// skipped (so a key cannot start with '#'); a key holding a space or tab is an error naming
// the line (never the key). A file without any key is an error: an empty Secret must not
// turn authentication off.
StatusOr<std::vector<std::string>> read_api_keys_file(const std::string& path);

}  // namespace tessera
