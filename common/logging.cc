#include "common/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace tessera {

void init_logging(const std::string& role_tag, spdlog::level::level_enum level) {
  auto logger = spdlog::stderr_color_mt("tessera");
  logger->set_pattern("%Y-%m-%d %H:%M:%S.%e [" + role_tag + "] %^%l%$ %v");
  logger->set_level(level);
  spdlog::set_default_logger(logger);
}

}  // namespace tessera
