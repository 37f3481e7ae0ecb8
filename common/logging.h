#pragma once
// One logger for the whole project (spdlog), tagged with the process role and rank so
// interleaved coordinator/worker output stays readable: "[coord]", "[w1]", "[gen]".
#include <spdlog/spdlog.h>

#include <string>

namespace tessera {

// Call once per process, before any log line. Logs go to stderr so stdout stays
// free for machine-readable output (--json).
void init_logging(const std::string& role_tag, spdlog::level::level_enum level = spdlog::level::info);

}  // namespace tessera

#define TESSERA_LOG_INFO(...) ::spdlog::info(__VA_ARGS__)
#define TESSERA_LOG_WARN(...) ::spdlog::warn(__VA_ARGS__)
#define TESSERA_LOG_ERROR(...) ::spdlog::error(__VA_ARGS__)
#define TESSERA_LOG_DEBUG(...) ::spdlog::debug(__VA_ARGS__)
