#pragma once
// Layers streamed from the checkpoint's own mapping (worker/checkpoint_backing.h) are mapped
// in and released again every step, so how fast the kernels read them depends on the page
// size the mapping gets. On the 2-core VM of docs/benchmarks.md, reading a 2.2 GB file through
// 4 KiB page-table entries ran at 1.9 GB/s and through 2 MiB ones at 13 GB/s (one thread): a
// ~1.1B bf16 model streaming 1.6 GB a step decoded 1.2 tok/s instead of 13-15.
//
// Which one it gets is decided by how the page cache holds the file, not by the process: a
// file just written (a conversion, a copy, a download) sits in the cache in the sizes its
// writes had (64 KiB here), while one read from the disk through a mapping that asked for
// huge pages (MADV_HUGEPAGE) is cached in 2 MiB folios, which map as 2 MiB pages. So at load
// each streamed range is mapped once and its 2 MiB-page share read from /proc/self/smaps
// (FilePmdMapped); a range found on small pages is written back if dirty, dropped from the page
// cache (posix_fadvise DONTNEED: only pages no process maps) and read again through the
// huge-page mapping. That costs one read of those bytes from the disk at start-up.
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/weight_file.h"

namespace tessera {

struct HugePageCheck {
  int ranges = 0;             // ranges that hold at least one whole 2 MiB page
  int read_again = 0;         // of those, found on small pages and read again from the disk
  int64_t bytes_read_again = 0;
  int still_small = 0;        // on small pages after that, or left so once reading again did not help
  double seconds = 0;
  std::string not_possible;   // why nothing was tried, where it was not (e.g. THP disabled)

  // One clause for the start-up log ("" when there was nothing to say).
  std::string describe(const std::string& path) const;
};

// Whether this kernel may give file mappings 2 MiB pages (transparent_hugepage/enabled is not
// "never"); `why_not` says what was found otherwise.
bool file_huge_pages_allowed(std::string* why_not);

// The bytes of the mapping holding `address` (one /proc/self/smaps entry) that are mapped on
// 2 MiB page-table entries of a file (FilePmdMapped); -1 when smaps cannot be read or no
// entry holds it.
int64_t file_pmd_mapped_bytes(const void* address);

// For each [offset, offset + size) of `file`'s whole mapping: asks for huge pages
// (MADV_HUGEPAGE), maps it, and where less than 9/10 of its whole 2 MiB pages map as such,
// reads it again from the disk as above; once a range read again stays on small pages, the
// rest are not read again (a network volume would be read whole for nothing). Leaves every
// range unmapped from this process (MADV_DONTNEED), as streamed units are between steps.
HugePageCheck map_on_huge_pages(const WeightFile& file, const std::vector<std::pair<size_t, size_t>>& ranges);

}  // namespace tessera
