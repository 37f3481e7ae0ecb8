#include "common/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>

namespace tessera {

void init_logging(const std::string& role_tag, spdlog::level::level_enum level) {
  auto logger = spdlog::stderr_color_mt("tessera");
  logger->set_pattern("%Y-%m-%d %H:%M:%S.%e [" + role_tag + "] %^%l%$ %v");
  // TESSERA_LOG_LEVEL (trace, debug, info, warn, error, off) overrides the default level.
  if (const char* env = std::getenv("TESSERA_LOG_LEVEL"); env != nullptr && *env != '\0') {
    level = spdlog::level::from_str(env);
  }
  logger->set_level(level);
  spdlog::set_default_logger(logger);
}

}  // namespace tessera
