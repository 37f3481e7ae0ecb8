#pragma once
// A process that dies of a fatal signal (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT) says so on
// stderr, with its role tag and a raw stack, before it dies of the same signal: without it an
// operator (or a CI log) sees only a server that stopped mid-sentence.

#include <string>

namespace tessera {

// Call once per process, early. Does nothing in a sanitized build, whose own handlers report
// more (and must keep theirs).
void install_crash_report(const std::string& role_tag);

}  // namespace tessera
