#include "worker/checkpoint_huge_pages.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "worker/weight_spill.h"
#include "worker/weight_units.h"

namespace tessera {
namespace {

struct Interior {
  char* begin = nullptr;  // the whole 2 MiB pages inside a range
  size_t size = 0;
};

Interior whole_huge_pages(const char* base, size_t offset, size_t size) {
  const uintptr_t from = reinterpret_cast<uintptr_t>(base) + offset, to = from + size;
  const uintptr_t first = align_up(from, kHugePage), last = to / kHugePage * kHugePage;
  if (last <= first) return {};
  return {reinterpret_cast<char*>(first), last - first};
}

bool populate(const Interior& r) {
#ifdef MADV_POPULATE_READ
  return ::madvise(r.begin, r.size, MADV_POPULATE_READ) == 0;
#else
  (void)r;
  return false;
#endif
}

// Maps `r` afresh (pages mapped earlier by small entries, while the checkpoint was read at
// load, would keep them) and returns how much of it maps on 2 MiB pages; -1 when unknown.
int64_t pmd_share_after_mapping(const Interior& r) {
  ::madvise(r.begin, r.size, MADV_DONTNEED);
  if (!populate(r)) return -1;
  return file_pmd_mapped_bytes(r.begin);
}

bool mostly_huge(int64_t pmd_bytes, size_t size) { return pmd_bytes >= 0 && pmd_bytes * 10 >= static_cast<int64_t>(size) * 9; }

// Drops `r` of `file` from the page cache (written back first: only clean pages go; `*fd`
// opened on the first call) and maps it again, which reads it from the disk onto huge pages.
void read_again(const WeightFile& file, const Interior& r, int* fd, HugePageCheck* check) {
  if (*fd < 0) {
    *fd = ::open(file.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (*fd >= 0) ::fdatasync(*fd);
  }
  ::madvise(r.begin, r.size, MADV_DONTNEED);
  if (*fd >= 0) {
    const off_t at = r.begin - file.whole_mapping().base;
    ::posix_fadvise(*fd, at, static_cast<off_t>(r.size), POSIX_FADV_DONTNEED);
  }
  ++check->read_again;
  check->bytes_read_again += static_cast<int64_t>(r.size);
  if (!mostly_huge(pmd_share_after_mapping(r), r.size)) ++check->still_small;
}

}  // namespace

std::string HugePageCheck::describe(const std::string& path) const {
  if (read_again == 0 && still_small == 0) return "";
  char seconds_text[32];
  std::snprintf(seconds_text, sizeof seconds_text, "%.1f", seconds);
  std::string s = path + ": the page cache held " + std::to_string(read_again) + " of the " + std::to_string(ranges) +
                  " streamed ranges on small pages; read them again from the disk onto 2 MiB pages (" +
                  weight_mib(bytes_read_again) + ", " + seconds_text + " s)";
  if (still_small > 0) {
    s += "; " + std::to_string(still_small) +
         " stay on small pages (the filesystem caches this file in small pieces, or another process maps it): "
         "they stream slower; model.weights_streaming read copies them onto huge pages instead";
  }
  return s;
}

bool file_huge_pages_allowed(std::string* why_not) {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string setting;
  if (!std::getline(in, setting)) {
    *why_not = "this kernel has no transparent huge pages";
    return false;
  }
  if (setting.find("[never]") != std::string::npos) {
    *why_not = "transparent huge pages are disabled (/sys/kernel/mm/transparent_hugepage/enabled: never)";
    return false;
  }
  return true;
}

int64_t file_pmd_mapped_bytes(const void* address) {
  std::ifstream in("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(address);
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    // An entry starts "start-end perms offset dev inode [path]"; its fields follow as "Name: value kB".
    char* dash = nullptr;
    const unsigned long long start = std::strtoull(line.c_str(), &dash, 16);
    if (dash != line.c_str() && *dash == '-') {
      const unsigned long long end = std::strtoull(dash + 1, nullptr, 16);
      inside = at >= start && at < end;
      continue;
    }
    if (inside && line.rfind("FilePmdMapped:", 0) == 0) return std::atoll(line.c_str() + 14) * 1024;
  }
  return -1;
}

HugePageCheck map_on_huge_pages(const WeightFile& file, const std::vector<std::pair<size_t, size_t>>& ranges) {
  HugePageCheck check;
  if (!file_huge_pages_allowed(&check.not_possible)) return check;
  const auto start = std::chrono::steady_clock::now();
  const char* base = file.whole_mapping().base;
  int fd = -1;
  for (const auto& [offset, size] : ranges) {
    const Interior r = whole_huge_pages(base, offset, size);
    if (r.size == 0) continue;
    ++check.ranges;
    ::madvise(r.begin, r.size, MADV_HUGEPAGE);
    const int64_t before = pmd_share_after_mapping(r);
    if (before < 0) {
      check.not_possible = "the mapping's page sizes cannot be read (MADV_POPULATE_READ or /proc/self/smaps)";
      ::madvise(r.begin, r.size, MADV_DONTNEED);
      break;
    }
    if (!mostly_huge(before, r.size)) {
      // Once reading one again did not help, the others would not either.
      if (check.still_small == 0) read_again(file, r, &fd, &check);
      else ++check.still_small;
    }
    ::madvise(r.begin, r.size, MADV_DONTNEED);
  }
  if (fd >= 0) ::close(fd);
  check.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return check;
}

}  // namespace tessera
