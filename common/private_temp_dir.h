#pragma once
// A private temporary folder for what a process hands its own children (the local workers'
// configuration, ipc sockets): made by mkdtemp (mode 0700, a name nobody could have prepared,
// never reused), named `<prefix>-<pid>-XXXXXX` so a later run can tell whose it was, removed
// when the owner goes away, and, after a kill -9 left one behind, removed by the next start
// of the same program (remove_stale_private_temp_dirs). Nothing here follows a symlink:
// files are created with O_CREAT | O_EXCL | O_NOFOLLOW, and the stale-folder sweep opens
// every folder it descends into with O_NOFOLLOW and only unlinks what is inside.
#include <sys/types.h>

#include <string>

#include "common/status.h"

namespace tessera {

class PrivateTempDir {
 public:
  PrivateTempDir() = default;
  ~PrivateTempDir() { remove(); }
  PrivateTempDir(PrivateTempDir&& other) noexcept : path_(std::move(other.path_)) { other.path_.clear(); }
  PrivateTempDir& operator=(PrivateTempDir&& other) noexcept;
  PrivateTempDir(const PrivateTempDir&) = delete;
  PrivateTempDir& operator=(const PrivateTempDir&) = delete;

  // A fresh folder `<temp>/<prefix>-<pid>-XXXXXX` (temp: $TMPDIR, else /tmp).
  static StatusOr<PrivateTempDir> create(const std::string& prefix);

  // Creates `name` inside the folder, mode 0600, refusing an existing file or symlink there
  // (O_EXCL | O_NOFOLLOW), and writes `content`; returns the file's path.
  StatusOr<std::string> write_file(const std::string& name, const std::string& content) const;

  const std::string& path() const { return path_; }
  bool empty() const { return path_.empty(); }
  // Removes the folder and what is in it (no symlink followed); idempotent.
  void remove();

 private:
  std::string path_;
};

// Removes `<temp>/<prefix>-<pid>-*` folders left by processes that no longer exist: only real
// folders (a symlink of that name is left alone), owned by this user, whose pid is not a
// running process. Returns how many were removed; what cannot be removed is skipped.
int remove_stale_private_temp_dirs(const std::string& prefix);

// Writes `content` to a new file at `path` (mode `mode`), refusing a path that exists,
// a symlink included (O_CREAT | O_EXCL | O_NOFOLLOW). `what` starts the error message.
Status write_new_file(const std::string& path, const std::string& content, mode_t mode, const std::string& what);

// Removes the folder `path` and everything below it without following any symlink (a
// symlink inside is unlinked, never its target). NotFound when `path` is absent.
Status remove_tree_nofollow(const std::string& path);

}  // namespace tessera
