#pragma once
// Invariants inside the engine. A failed check is a bug, not a user error: it prints the
// expression, both values, file:line and the streamed message, then aborts. User-facing
// errors use Status instead (common/status.h).
#include <cstdlib>
#include <iostream>
#include <sstream>

namespace tessera::detail {

class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* expr) {
    stream_ << file << ":" << line << ": check failed: " << expr << " ";
  }
  [[noreturn]] ~CheckFailure() {
    std::cerr << stream_.str() << std::endl;
    std::abort();
  }
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

// Lets `cond ? (void)0 : Voidify() & stream << ...` type-check.
struct Voidify {
  void operator&(std::ostream&) {}
};

}  // namespace tessera::detail

#define TESSERA_CHECK(cond)                 \
  (cond) ? (void)0                          \
         : ::tessera::detail::Voidify() &   \
               ::tessera::detail::CheckFailure(__FILE__, __LINE__, #cond).stream()

#define TESSERA_CHECK_OP(a, b, op)                                                        \
  ((a)op(b)) ? (void)0                                                                    \
             : ::tessera::detail::Voidify() &                                             \
                   ::tessera::detail::CheckFailure(__FILE__, __LINE__, #a " " #op " " #b) \
                           .stream()                                                      \
                       << "(" << (a) << " vs " << (b) << ") "

#define TESSERA_CHECK_EQ(a, b) TESSERA_CHECK_OP(a, b, ==)
#define TESSERA_CHECK_NE(a, b) TESSERA_CHECK_OP(a, b, !=)
#define TESSERA_CHECK_LT(a, b) TESSERA_CHECK_OP(a, b, <)
#define TESSERA_CHECK_LE(a, b) TESSERA_CHECK_OP(a, b, <=)
#define TESSERA_CHECK_GT(a, b) TESSERA_CHECK_OP(a, b, >)
#define TESSERA_CHECK_GE(a, b) TESSERA_CHECK_OP(a, b, >=)
