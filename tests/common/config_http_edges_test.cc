// The HTTP front end's connection limits and CORS keys (server.http.max_connections,
// idle_timeout_s, header_timeout_s, cors_origins): defaults, ranges, origin forms, and a
// dump that parses back to the same values.
#include <gtest/gtest.h>

#include "common/config.h"

namespace tessera {
namespace {

TEST(ConfigHttpEdges, DefaultsAreTheDocumentedOnes) {
  auto c = parse_config_yaml("", "empty.yaml");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->server.http.max_connections, 0);  // from the fd limit
  EXPECT_EQ(c->server.http.idle_timeout_s, 120);
  EXPECT_EQ(c->server.http.header_timeout_s, 10);
  EXPECT_TRUE(c->server.http.cors_origins.empty());
}

TEST(ConfigHttpEdges, ValuesParseAndRoundTrip) {
  auto c = parse_config_yaml(
      "server:\n  http:\n    max_connections: 5000\n    idle_timeout_s: 30\n    header_timeout_s: 3\n"
      "    cors_origins: ['https://app.example', 'http://localhost:3000', '*']\n",
      "h.yaml");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->server.http.max_connections, 5000);
  EXPECT_EQ(c->server.http.idle_timeout_s, 30);
  EXPECT_EQ(c->server.http.header_timeout_s, 3);
  EXPECT_EQ(c->server.http.cors_origins,
            (std::vector<std::string>{"https://app.example", "http://localhost:3000", "*"}));
  auto again = parse_config_yaml(dump_config_yaml(*c), "dumped.yaml");
  ASSERT_TRUE(again.is_ok()) << again.status().to_string();
  EXPECT_EQ(again->server.http.cors_origins, c->server.http.cors_origins);
  EXPECT_EQ(again->server.http.header_timeout_s, 3);
  TesseraConfig d;
  ASSERT_TRUE(apply_override_arg(d, "server.http.cors_origins=[\"https://a.example\"]").is_ok());
  EXPECT_EQ(d.server.http.cors_origins, (std::vector<std::string>{"https://a.example"}));
}

TEST(ConfigHttpEdges, BadValuesNameTheKeyAndWhatIsExpected) {
  struct Case {
    std::string yaml, key, expected;
  };
  for (const Case& k : std::vector<Case>{
           {"server: {http: {max_connections: -1}}", "server.http.max_connections", "[0, 1000000]"},
           {"server: {http: {idle_timeout_s: 0}}", "server.http.idle_timeout_s", "[1, 86400]"},
           {"server: {http: {header_timeout_s: 4000}}", "server.http.header_timeout_s", "[1, 3600]"},
           {"server: {http: {cors_origins: 'https://a'}}", "server.http.cors_origins", "list of strings"},
           {"server: {http: {cors_origins: ['app.example']}}", "server.http.cors_origins[0]", "not an origin"},
           {"server: {http: {cors_origins: ['*', 'https://a.example/path']}}", "server.http.cors_origins[1]",
            "no path"}}) {
    const Status st = parse_config_yaml(k.yaml, "bad.yaml").status();
    ASSERT_FALSE(st.is_ok()) << k.yaml;
    EXPECT_NE(st.message().find(k.key), std::string::npos) << st.message();
    EXPECT_NE(st.message().find(k.expected), std::string::npos) << st.message();
  }
}

}  // namespace
}  // namespace tessera
