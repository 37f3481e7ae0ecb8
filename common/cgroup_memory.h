#pragma once
// The memory limit of the cgroup this process runs in (a container's), so that a worker that
// reports its memory reports what it may use there rather than what the host has: cgroup v2
// (memory.max, memory.current) or v1's memory hierarchy (memory.limit_in_bytes,
// memory.usage_in_bytes), the tightest limit among the group and its ancestors. The page cache
// of files (active_file and inactive_file; not tmpfs or shared memory, which are anon) does not
// count as used: the kernel reclaims it before the group's OOM killer acts.
#include <cstdint>
#include <optional>
#include <string>

namespace tessera {

struct CgroupMemory {
  int64_t limit_bytes = 0;      // the tightest limit on the way to the root
  int64_t available_bytes = 0;  // that limit less what the group holds and would not drop
};

// `proc_self_cgroup`: /proc/self/cgroup's text; `root`: where the cgroup file systems are
// mounted (/sys/fs/cgroup). nullopt when no limit applies (none set, or none readable).
std::optional<CgroupMemory> cgroup_memory(const std::string& proc_self_cgroup, const std::string& root);

// The same for this process.
std::optional<CgroupMemory> this_process_cgroup_memory();

}  // namespace tessera
