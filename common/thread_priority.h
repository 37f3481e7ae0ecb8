#pragma once
// Background work of the coordinator (preparing a heavy request, finishing a costly
// structured-output mask) runs on threads of lower CPU priority, so that on a host whose
// cores it shares with the workers it takes only the time nobody else wants: the forward pass,
// the I/O threads and /health go first.

namespace tessera {

// Raises the calling thread's nice value by `increment` (Linux: per thread). Best effort: a
// failure leaves it as it was.
void lower_this_thread_priority(int increment = 10);

}  // namespace tessera
