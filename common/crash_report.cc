#include "common/crash_report.h"

#include <execinfo.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>

namespace tessera {
namespace {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitizerHandlesSignals = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitizerHandlesSignals = true;
#else
constexpr bool kSanitizerHandlesSignals = false;
#endif
#else
constexpr bool kSanitizerHandlesSignals = false;
#endif

constexpr std::array<int, 5> kFatalSignals = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};

// Filled once at install time: the handler may only call async-signal-safe functions, so it
// writes this prepared text rather than formatting anything.
char g_prefix[96];
size_t g_prefix_len = 0;

void write_all(const char* text, size_t len) {
  while (len > 0) {
    const ssize_t n = ::write(STDERR_FILENO, text, len);
    if (n <= 0) return;
    text += n;
    len -= static_cast<size_t>(n);
  }
}

void write_text(const char* text) { write_all(text, ::strlen(text)); }

const char* signal_name(int sig) {
  switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    case SIGABRT: return "SIGABRT";
    default: return "?";
  }
}

void report_and_die(int sig) {
  char number[4] = {static_cast<char>('0' + sig / 10 % 10), static_cast<char>('0' + sig % 10), '\0', '\0'};
  write_all(g_prefix, g_prefix_len);
  write_text(number[0] == '0' ? number + 1 : number);
  write_text(" (");
  write_text(signal_name(sig));
  write_text("); stack (addr2line -e <binary> resolves the offsets):\n");
  void* frames[64];
  const int depth = ::backtrace(frames, 64);
  ::backtrace_symbols_fd(frames, depth, STDERR_FILENO);
  // Die of the same signal, so the exit status still tells what happened.
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

}  // namespace

void install_crash_report(const std::string& role_tag) {
  if (kSanitizerHandlesSignals) return;
  const std::string prefix = "[" + role_tag + "] fatal signal ";
  g_prefix_len = std::min(prefix.size(), sizeof(g_prefix));
  ::memcpy(g_prefix, prefix.data(), g_prefix_len);
  // backtrace() loads libgcc on its first call, which is not safe inside a handler: call it now.
  void* warm[1];
  ::backtrace(warm, 1);
  // An alternate stack, so a stack overflow is reported too.
  static char alt_stack[64 * 1024];
  stack_t ss{};
  ss.ss_sp = alt_stack;
  ss.ss_size = sizeof(alt_stack);
  ::sigaltstack(&ss, nullptr);
  struct sigaction sa{};
  sa.sa_handler = report_and_die;
  sa.sa_flags = SA_ONSTACK | SA_RESETHAND;
  sigemptyset(&sa.sa_mask);
  for (int sig : kFatalSignals) ::sigaction(sig, &sa, nullptr);
}

}  // namespace tessera
