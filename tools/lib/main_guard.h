#pragma once
// The last line of defence of every program's main: an exception that escapes it (from a
// library, or a bug that let one through instead of a Status) ends the program with one line
// naming the program and the exception, and exit status 1 — never std::terminate's abort
// (status 134 and a core dump) for what a user handed it.
#include <exception>
#include <iostream>

namespace tessera {

template <class Body>
int run_guarded(const char* program, Body body) {
  try {
    return body();
  } catch (const std::exception& e) {
    std::cerr << program << ": internal error: " << e.what() << std::endl;
  } catch (...) {
    std::cerr << program << ": internal error: an unknown exception" << std::endl;
  }
  return 1;
}

}  // namespace tessera
