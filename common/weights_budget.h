#pragma once
// model.weights_memory_budget (docs/configuration.md): how many bytes of one rank's weights
// may stay resident where it computes; the rest is streamed layer by layer from a backing
// store (worker/weight_residency.h). Written as a byte count ("6GiB", "500MB", "1048576") or
// as a share of the rank's own weights ("25%"); "all" (the default) keeps every weight resident.
#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace tessera {

struct WeightsBudget {
  int64_t bytes = -1;  // a byte count, or -1
  double share = 0;    // (0, 1): a share of the rank's weight bytes, or 0
  bool all() const { return bytes < 0 && share <= 0; }
  // The budget for a rank holding `weight_bytes` of weights (every byte for all()).
  int64_t bytes_for(int64_t weight_bytes) const;
  std::string to_string() const;  // as written back to a config ("all", "25%", "1073741824")
};

// InvalidArgument naming the text and the forms accepted (the caller names the key or flag); 0 bytes and 0% or 100% and more
// are refused (100% is "all").
StatusOr<WeightsBudget> parse_weights_budget(std::string_view text);

// model.weights_streaming: how a streamed unit is brought in before it runs.
//   map:    the spill file is mapped and its pages are read in (madvise) on a helper thread;
//           they are the page cache's, so memory pressure can take them back before they run.
//   read:   the helper reads the unit (pread, through the page cache) into the process's own
//           pages, which nothing reclaims until the unit is released.
//   direct: as read, with O_DIRECT: straight from the disk, no page-cache copy (the cold case).
enum class WeightStreaming { kMap, kRead, kDirect };
const char* weight_streaming_name(WeightStreaming s);
// InvalidArgument naming the text and the three names (the caller names the key or flag).
StatusOr<WeightStreaming> parse_weight_streaming(std::string_view text);

}  // namespace tessera
