#pragma once
// Gloo Communicator: CPU tensor-parallel ranks on different hosts, over TCP (Gloo, the
// collective library PyTorch uses for CPU tensors; Debian's libgloo-dev). Each rank listens on
// one address, the ranks publish their addresses through a rendezvous (GlooRendezvous) and
// connect in a full mesh.
//
// Every collective is an exchange over the mesh: a rank sends its part straight to each peer
// and receives each peer's part, so one step moves it (world 2: the bytes a ring all-reduce
// moves), in chunks of 64 KB. The connections run in Gloo's synchronous mode: the calling
// thread writes and reads the sockets itself, with no hand-off to Gloo's I/O thread (which
// cost about 1 ms a collective inside a decode on a 2-core machine). A sum is then taken locally in rank order 0..N-1 (bf16 summed in f32 and rounded
// once): the results are the shared-memory communicator's, bit for bit, on every rank.
//
// A peer that dies closes its connections and the collective fails at once; one that stops
// answering fails it after `timeout_ms`. Either way the error is Unavailable, names the
// collective and the missing rank(s), and the communicator stays failed (the group is formed
// again by new processes), never desynchronised. A process that makes one ignores SIGPIPE
// (unless it handles it): Gloo's writes to a dead peer would otherwise kill it.
#include <memory>
#include <string>

#include "common/communicator.h"
#include "common/status.h"

namespace tessera {

// Where the ranks of one group leave their addresses and find the others'. Keys are written
// once; a get waits for its key.
class GlooRendezvous {
 public:
  virtual ~GlooRendezvous() = default;
  virtual Status set(const std::string& key, const std::string& value) = 0;
  // The key's value once some rank set it; Unavailable after `timeout_ms`.
  virtual StatusOr<std::string> get(const std::string& key, int timeout_ms) = 0;
};

// A folder every rank can see (one host, or a shared filesystem): a file per key, written
// whole and renamed into place. The folder must be fresh for each group.
std::unique_ptr<GlooRendezvous> make_folder_rendezvous(const std::string& dir);

struct GlooOptions {
  int rank = 0;
  int world_size = 1;
  // The address this rank listens on and its peers connect to: a host name or IP, or
  // (interface) a network interface's name whose address is used. Both empty: the host's name.
  std::string address;
  std::string interface;
  int timeout_ms = 30000;  // forming the group, and each collective
};

StatusOr<std::unique_ptr<Communicator>> make_gloo_communicator(const GlooOptions& options, GlooRendezvous& rendezvous);

}  // namespace tessera
