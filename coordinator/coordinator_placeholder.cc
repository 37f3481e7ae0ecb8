// The coordinator library's first members (block manager, scheduler) are being written;
// this keeps the library non-empty meanwhile.
namespace tessera {}
