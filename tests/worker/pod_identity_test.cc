// Rank, world size and coordinator address of a worker in a pod (worker/pod_identity.h):
// the precedence documented in docs/deployment.md, and clear errors on conflicts.
#include "worker/pod_identity.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

TesseraConfig config_tp(int tp) {
  TesseraConfig c;
  c.model.path = "m";
  c.parallel.tensor_parallel = tp;
  c.server.control = "tcp://0.0.0.0:5560";
  return c;
}

PodEnvironment pod(std::map<std::string, std::string> env, std::string host = "laptop") {
  return PodEnvironment{std::move(env), std::move(host)};
}

std::string error_of(const StatusOr<WorkerIdentity>& id) { return id.is_ok() ? "ok" : id.status().message(); }

TEST(PodIdentityTest, ExplicitRankWinsOverTheEnvironment) {
  auto id = resolve_worker_identity("1", config_tp(2), pod({{"TESSERA_RANK", "0"}, {"LWS_WORKER_INDEX", "0"}}, "w-0"));
  ASSERT_TRUE(id.is_ok()) << error_of(id);
  EXPECT_EQ(id->rank, 1);
  EXPECT_EQ(id->rank_source, "--rank");
  EXPECT_EQ(id->control_address, "tcp://0.0.0.0:5560");
  EXPECT_EQ(id->address_source, "server.control");
  EXPECT_NE(error_of(resolve_worker_identity("2", config_tp(2), pod({}))).find("--rank 2 outside parallel.tensor_parallel = 2"),
            std::string::npos);
  EXPECT_NE(error_of(resolve_worker_identity("one", config_tp(2), pod({}))).find("--rank one: expected"),
            std::string::npos);
}

TEST(PodIdentityTest, AutoRankFromEnvironmentThenHostnameOrdinal) {
  auto id = resolve_worker_identity("auto", config_tp(4), pod({{"TESSERA_RANK", "2"}}, "tessera-worker-0"));
  ASSERT_TRUE(id.is_ok()) << error_of(id);
  EXPECT_EQ(id->rank, 2);
  EXPECT_EQ(id->rank_source, "TESSERA_RANK");
  id = resolve_worker_identity("", config_tp(4), pod({{"LWS_WORKER_INDEX", "3"}, {"LWS_GROUP_SIZE", "4"}}));
  ASSERT_TRUE(id.is_ok()) << error_of(id);
  EXPECT_EQ(id->rank, 3);
  EXPECT_EQ(id->rank_source, "LWS_WORKER_INDEX");
  // Agreeing variables are fine; disagreeing ones are an error naming both.
  EXPECT_TRUE(resolve_worker_identity("auto", config_tp(4), pod({{"TESSERA_RANK", "1"}, {"LWS_WORKER_INDEX", "1"}})).is_ok());
  EXPECT_NE(error_of(resolve_worker_identity("auto", config_tp(4), pod({{"TESSERA_RANK", "1"}, {"LWS_WORKER_INDEX", "2"}})))
                .find("TESSERA_RANK=1 and LWS_WORKER_INDEX=2 disagree"),
            std::string::npos);
  // StatefulSet pods: NAME-ORDINAL, also as a fully qualified name.
  id = resolve_worker_identity("auto", config_tp(4), pod({}, "tessera-worker-3"));
  ASSERT_TRUE(id.is_ok()) << error_of(id);
  EXPECT_EQ(id->rank, 3);
  EXPECT_EQ(id->rank_source, "the hostname 'tessera-worker-3'");
  id = resolve_worker_identity("auto", config_tp(4), pod({}, "tessera-worker-1.tessera-workers.default.svc"));
  ASSERT_TRUE(id.is_ok()) << error_of(id);
  EXPECT_EQ(id->rank, 1);
  EXPECT_NE(error_of(resolve_worker_identity("auto", config_tp(4), pod({}, "laptop"))).find("hostname 'laptop' does not end in -N"),
            std::string::npos);
  // No --rank at all and no pod environment: rank 0, as hand-started workers always were.
  id = resolve_worker_identity("", config_tp(4), pod({}, "laptop"));
  ASSERT_TRUE(id.is_ok()) << error_of(id);
  EXPECT_EQ(id->rank, 0);
  EXPECT_EQ(id->rank_source, "the default (no --rank, no pod environment)");
  EXPECT_NE(error_of(resolve_worker_identity("auto", config_tp(2), pod({}, "tessera-worker-2")))
                .find("more StatefulSet replicas than tensor_parallel"),
            std::string::npos);
  EXPECT_NE(error_of(resolve_worker_identity("auto", config_tp(2), pod({{"TESSERA_RANK", "-1"}}))).find("TESSERA_RANK=-1"),
            std::string::npos);
}

TEST(PodIdentityTest, GroupSizeMustEqualTensorParallel) {
  EXPECT_NE(error_of(resolve_worker_identity("0", config_tp(2), pod({{"LWS_GROUP_SIZE", "3"}})))
                .find("LWS_GROUP_SIZE=3 but parallel.tensor_parallel = 2"),
            std::string::npos);
  EXPECT_NE(error_of(resolve_worker_identity("0", config_tp(2), pod({{"LWS_GROUP_SIZE", "x"}}))).find("LWS_GROUP_SIZE=x"),
            std::string::npos);
}

TEST(PodIdentityTest, CoordinatorAddressPrecedence) {
  TesseraConfig c = config_tp(2);
  c.worker.control_address = "tcp://tessera-coordinator:5560";
  auto id = resolve_worker_identity("0", c, pod({}));
  ASSERT_TRUE(id.is_ok());
  EXPECT_EQ(id->control_address, "tcp://tessera-coordinator:5560");
  EXPECT_EQ(id->address_source, "worker.control_address");
  id = resolve_worker_identity("0", c, pod({{"LWS_LEADER_ADDRESS", "tessera-0.tessera.default"}}));
  ASSERT_TRUE(id.is_ok());
  EXPECT_EQ(id->control_address, "tcp://tessera-0.tessera.default:5560");  // port from server.control
  EXPECT_EQ(id->address_source, "LWS_LEADER_ADDRESS");
  for (const auto& [value, want] : std::vector<std::pair<std::string, std::string>>{
           {"tcp://10.0.0.1:7000", "tcp://10.0.0.1:7000"}, {"coord:7001", "tcp://coord:7001"}, {"coord", "tcp://coord:5560"}}) {
    id = resolve_worker_identity("0", c, pod({{"TESSERA_CONTROL_ADDRESS", value}, {"LWS_LEADER_ADDRESS", "x"}}));
    ASSERT_TRUE(id.is_ok()) << value << ": " << error_of(id);
    EXPECT_EQ(id->control_address, want);
    EXPECT_EQ(id->address_source, "TESSERA_CONTROL_ADDRESS");
  }
  EXPECT_NE(error_of(resolve_worker_identity("0", c, pod({{"TESSERA_CONTROL_ADDRESS", "http://x:1"}}))).find("expected tcp://"),
            std::string::npos);
  c.server.control = "ipc:///tmp/ctl";
  EXPECT_NE(error_of(resolve_worker_identity("0", c, pod({{"LWS_LEADER_ADDRESS", "leader"}}))).find("not tcp://HOST:PORT"),
            std::string::npos);
  c.server.control = "tcp://0.0.0.0:*";
  EXPECT_NE(error_of(resolve_worker_identity("0", c, pod({{"LWS_LEADER_ADDRESS", "leader"}}))).find("no fixed port"),
            std::string::npos);
}

}  // namespace
}  // namespace tessera
