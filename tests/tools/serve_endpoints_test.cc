// tessera-serve's internal endpoints (server.control, server.zmq_client) on one host: left to
// their defaults they take free ports, so two servers differing only in --port both serve; an
// endpoint that is given is bound exactly; the log says which were chosen.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <regex>
#include <string>
#include <vector>

#include "tests/test_support.h"
#include "tests/tools/serve_process.h"

namespace tessera {
namespace {

bool completion_succeeds(int port) {
  const std::string r = testing::http(port, "POST", "/v1/completions", R"({"prompt": [1, 2, 3], "max_tokens": 3})");
  return r.find("200 OK") != std::string::npos && r.find("\"text_completion\"") != std::string::npos;
}

// A TCP port nobody listens on right now (bound, read back, released).
int unused_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    return 0;
  }
  close(fd);
  return ntohs(addr.sin_port);
}

TEST(ServeEndpoints, TwoServersDifferingOnlyInPortBothServe) {
  TESSERA_REQUIRE_FIXTURES();
  testing::ServeProcess first, second;
  first.use_default_endpoints();
  second.use_default_endpoints();
  ASSERT_TRUE(first.start(testing::tiny_llama_cpu_args({"--set", "cache.num_blocks=64"}))) << first.log();
  ASSERT_TRUE(second.start(testing::tiny_llama_cpu_args({"--set", "cache.num_blocks=64"}))) << second.log();
  EXPECT_NE(first.port(), second.port());
  EXPECT_TRUE(completion_succeeds(first.port())) << first.log();
  EXPECT_TRUE(completion_succeeds(second.port())) << second.log();
  // Each log names what it chose and where it bound.
  const std::regex control(R"(worker group: listening on tcp://127\.0\.0\.1:(\d+))");
  const std::regex clients(R"(zmq clients on tcp://127\.0\.0\.1:(\d+))");
  std::vector<std::string> bound;
  for (const testing::ServeProcess* s : {&first, &second}) {
    const std::string log = s->log();
    EXPECT_NE(log.find("server.control and server.zmq_client not configured: binding a free port on 127.0.0.1"),
              std::string::npos)
        << log;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(log, m, control)) << log;
    bound.push_back(m[1]);
    ASSERT_TRUE(std::regex_search(log, m, clients)) << log;
    bound.push_back(m[1]);
  }
  for (size_t i = 0; i < bound.size(); ++i) {
    for (size_t j = i + 1; j < bound.size(); ++j) EXPECT_NE(bound[i], bound[j]);
  }
}

TEST(ServeEndpoints, AGivenEndpointIsBoundExactly) {
  TESSERA_REQUIRE_FIXTURES();
  const int control_port = unused_port();
  ASSERT_GT(control_port, 0);
  const std::string control = "tcp://127.0.0.1:" + std::to_string(control_port);
  testing::ServeProcess server;
  server.use_default_endpoints();
  ASSERT_TRUE(server.start(testing::tiny_llama_cpu_args({"--set", "cache.num_blocks=64", "--set", "server.control=" + control}))) << server.log();
  const std::string log = server.log();
  EXPECT_NE(log.find("worker group: listening on " + control + " "), std::string::npos) << log;
  // Only the endpoint not given was chosen.
  EXPECT_NE(log.find("server.zmq_client not configured: binding a free port"), std::string::npos) << log;
  EXPECT_EQ(log.find("server.control and"), std::string::npos) << log;
  EXPECT_TRUE(completion_succeeds(server.port())) << log;
}

}  // namespace
}  // namespace tessera
