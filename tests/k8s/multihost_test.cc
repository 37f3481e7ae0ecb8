// Tessera across real network hosts, configured the way the Kubernetes manifests configure
// pods: network namespaces joined by a bridge (one "switch" namespace holding the bridge, one
// namespace per pod, each with its own eth0 on 10.213.0.0/24 and an /etc/hosts that gives the
// Services' DNS names), the coordinator in one, each worker in its own. Every process reads
// k8s/base/tessera.yaml (the ConfigMap) with only the deployment's values replaced (the model,
// CPU ranks, short heartbeats); workers run the StatefulSet container's args and env, with the
// pod's hostname (tessera-worker-N: the rank comes from the ordinal) in a restart loop that
// mirrors restartPolicy: Always.
//
// Each pod also has its own mount namespace and /dev/shm, so the ranks reduce over Gloo (TCP).
//
// 1. The fixture's greedy tokens at TP=2 over HTTP; cutting worker 1's link fails the request
//    in flight clearly (503, retryable) and makes /ready say 503 within a few heartbeats; restoring it, the
//    restarted rank re-registers and service resumes.
// 2. CURVE with an allow-list: the group works with the right keys; a worker holding the
//    server key but an unknown keypair is refused (both sides say so) and the group still
//    serves.
// 3. A Gloo address a peer cannot reach: the rank that cannot connect names it and fails set-up.
// 4. Three ranks on three hosts (tiny-bloom) give the goldens.
//
// Needs root and `ip netns` (skips visibly otherwise). Names are unique per run; everything
// is torn down by RAII even when a check fails, and namespaces left by a killed earlier run
// (its pid gone) are removed first.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <fcntl.h>
#include <functional>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "common/config.h"
#include "tests/test_support.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr const char* kPrefix = "tsmh";  // every namespace of this test starts with it
constexpr int kHeartbeatMs = 200;

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

testing::CommandResult sh(const std::string& cmd) { return testing::run_command(cmd); }


bool ip_netns_available() {
  if (geteuid() != 0) return false;
  return sh("ip netns list >/dev/null 2>&1").exit_code == 0;
}

// Namespaces of earlier runs whose process is gone (a run killed by a timeout cannot clean).
void remove_stale_namespaces() {
  std::istringstream list(sh("ip netns list 2>/dev/null").out);
  for (std::string line; std::getline(list, line);) {
    const std::string name = line.substr(0, line.find(' '));
    std::smatch m;
    static const std::regex re(std::string(kPrefix) + "(\\d+)[a-z]*-.*");
    if (!std::regex_match(name, m, re)) continue;
    const pid_t pid = std::stoi(m[1]);
    if (pid == getpid() || (kill(pid, 0) == 0 || errno != ESRCH)) continue;
    sh("for p in $(ip netns pids " + name + " 2>/dev/null); do kill -9 $p; done; ip netns del " + name + " 2>/dev/null");
    fs::remove_all("/etc/netns/" + name);
  }
}

// One "pod" process tree: started in its own process group (killed as one).
struct PodProcess {
  pid_t pid = -1;
  std::string log;
};

// Hosts on one bridge, and the processes started in them. Destroying it kills the processes
// and deletes the namespaces (and their veths, the bridge, /etc/netns/NAME).
class Cluster {
 public:
  explicit Cluster(const std::string& tag) : base_(std::string(kPrefix) + std::to_string(getpid()) + tag + "-") {
    dir_ = testing::make_temp_dir("tessera-multihost");
  }
  ~Cluster() {
    for (PodProcess& p : processes_) stop(p);
    for (const std::string& ns : namespaces_) {
      sh("ip netns del " + ns + " 2>/dev/null");
      fs::remove_all("/etc/netns/" + ns);
    }
    if (::testing::Test::HasFailure()) {
      std::cout << "[ LOGS     ] kept in " << dir_ << std::endl;
    } else {
      fs::remove_all(dir_);
    }
  }

  const std::string& dir() const { return dir_; }
  std::string ns(const std::string& host) const { return base_ + host; }

  // The switch: a bridge in a namespace of its own (nothing touches the host's network).
  ::testing::AssertionResult make_switch() {
    return run({"ip netns add " + ns("sw"), "ip -n " + ns("sw") + " link add br0 type bridge",
                "ip -n " + ns("sw") + " link set br0 up"},
               "sw");
  }

  // A host "pod" with eth0 = 10.213.0.N/24 on the switch; /etc/hosts names the coordinator's
  // Services (tessera, tessera-control) as the cluster DNS would.
  ::testing::AssertionResult add_host(const std::string& host, int octet) {
    const std::string n = ns(host), sw = ns("sw"), port = "p-" + host;
    auto r = run({"ip netns add " + n,
                  "ip -n " + sw + " link add " + port + " type veth peer name eth0 netns " + n,
                  "ip -n " + sw + " link set " + port + " master br0 up",
                  "ip -n " + n + " addr add 10.213.0." + std::to_string(octet) + "/24 dev eth0",
                  "ip -n " + n + " link set eth0 up", "ip -n " + n + " link set lo up"},
                 host);
    if (!r) return r;
    fs::create_directories("/etc/netns/" + n);
    // The workers' pod names too (a pod's own name resolves to its IP, as the kubelet's
    // /etc/hosts says; Gloo listens on that address).
    std::string hosts = "127.0.0.1 localhost\n10.213.0.1 tessera tessera-control\n";
    for (int w = 0; w < 4; ++w) hosts += "10.213.0." + std::to_string(2 + w) + " tessera-worker-" + std::to_string(w) + "\n";
    testing::write_file("/etc/netns/" + n + "/hosts", hosts);
    return ::testing::AssertionSuccess();
  }

  // The switch port of a host: down = its cable is pulled.
  ::testing::AssertionResult set_link(const std::string& host, bool up) {
    return run({"ip -n " + ns("sw") + " link set p-" + host + (up ? " up" : " down")}, host);
  }

  // Runs `script` with /bin/sh inside the host's namespace, output to NAME.log.
  PodProcess& start(const std::string& host, const std::string& name, const std::string& script) {
    PodProcess p;
    p.log = dir_ + "/" + name + ".log";
    std::vector<std::string> args = {"/usr/bin/env", "ip", "netns", "exec", ns(host), "/bin/sh", "-c", script};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int fd = ::open(p.log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    p.pid = fork();
    if (p.pid == 0) {
      setpgid(0, 0);
      alarm(280);  // never outlive the test (ctest's limit is 300 s)
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      execv(argv[0], argv.data());
      _exit(127);
    }
    ::close(fd);
    setpgid(p.pid, p.pid);
    processes_.push_back(p);
    return processes_.back();
  }

  static void stop(PodProcess& p) {
    if (p.pid <= 0) return;
    kill(-p.pid, SIGKILL);
    kill(p.pid, SIGKILL);
    waitpid(p.pid, nullptr, 0);
    p.pid = -1;
  }

  // curl inside the coordinator's namespace; returns "CODE\nBODY".
  std::pair<int, std::string> http(const std::string& method, const std::string& path, const std::string& body = "",
                                   int timeout_s = 60) {
    const std::string file = dir_ + "/request.json";
    testing::write_file(file, body);
    auto r = sh("ip netns exec " + ns("c") + " curl -s -m " + std::to_string(timeout_s) + " -X " + method +
                " -H 'Content-Type: application/json' " + (body.empty() ? "" : "--data-binary @" + file) +
                " -w '\\n%{http_code}' http://tessera:8000" + path);
    const size_t nl = r.out.rfind('\n');
    if (nl == std::string::npos) return {0, r.out + r.err};
    return {std::atoi(r.out.c_str() + nl + 1), r.out.substr(0, nl)};
  }

 private:
  ::testing::AssertionResult run(const std::vector<std::string>& cmds, const std::string& what) {
    if (std::find(namespaces_.begin(), namespaces_.end(), ns(what)) == namespaces_.end()) namespaces_.push_back(ns(what));
    for (const std::string& c : cmds) {
      auto r = sh(c + " 2>&1");
      if (r.exit_code != 0) return ::testing::AssertionFailure() << c << ": " << r.out << r.err;
    }
    return ::testing::AssertionSuccess();
  }

  std::string base_;
  std::string dir_;
  std::vector<std::string> namespaces_;
  std::deque<PodProcess> processes_;  // references stay valid as it grows
};

bool wait_for(const std::function<bool()>& cond, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (cond()) return true;
    std::this_thread::sleep_for(50ms);
  }
  return cond();
}

bool log_has(const PodProcess& p, const std::string& text) {
  return testing::read_file(p.log).find(text) != std::string::npos;
}

// The worker container of k8s/base/workers-statefulset.yaml: its args (program first) and env.
struct WorkerSpec {
  std::vector<std::string> args;
  std::vector<std::pair<std::string, std::string>> env;
};

WorkerSpec statefulset_worker() {
  WorkerSpec spec;
  const YAML::Node sts = YAML::LoadFile(testing::source_dir() + "/k8s/base/workers-statefulset.yaml");
  const YAML::Node c = sts["spec"]["template"]["spec"]["containers"][0];
  for (const auto& a : c["args"]) spec.args.push_back(a.as<std::string>());
  for (const auto& e : c["env"]) spec.env.emplace_back(e["name"].as<std::string>(), e["value"].as<std::string>());
  return spec;
}

// The ConfigMap's tessera.yaml with this test's deployment values, written to DIR/tessera.yaml.
// `ranks`: the tensor_parallel the extra settings give (the base ConfigMap's is 2).
std::string write_config(const std::string& dir, const std::vector<std::pair<std::string, std::string>>& extra,
                         int ranks = 2) {
  auto c = load_config_file(testing::source_dir() + "/k8s/base/tessera.yaml");
  EXPECT_TRUE(c.is_ok()) << c.status().to_string();
  std::vector<std::pair<std::string, std::string>> sets = {
      {"model.path", testing::fixtures_dir() + "/tiny-llama"},
      {"model.dtype", "float32"},
      {"cache.num_blocks", "256"},
      {"worker.backend", "cpu"},
      {"worker.threads", "1"},
      {"server.heartbeat_ms", std::to_string(kHeartbeatMs)},
      // A request arriving while a rank is lost waits this long for the group, then gets 503.
      {"server.worker_restart_wait_s", "1"}};
  sets.insert(sets.end(), extra.begin(), extra.end());
  for (const auto& [k, v] : sets) EXPECT_TRUE(apply_override(c.value(), k, v).is_ok()) << k;
  EXPECT_TRUE(validate_config(c.value()).is_ok()) << validate_config(c.value()).to_string();
  EXPECT_EQ(c->parallel.tensor_parallel, ranks) << "the base ConfigMap's tensor_parallel, or the one asked for";
  const std::string path = dir + "/tessera.yaml";
  testing::write_file(path, dump_config_yaml(c.value()));
  return path;
}

// The pod's command line: hostname (StatefulSet pod name), the container env, the args with
// the config path and program location of this build, restarted whenever it exits.
std::string worker_script(const WorkerSpec& spec, const std::string& config, const std::string& hostname,
                          const std::vector<std::string>& extra_args, bool restart,
                          const std::vector<std::pair<std::string, std::string>>& extra_env = {}) {
  std::string cmd = "env";
  for (const auto& [k, v] : spec.env) cmd += " " + k + "=" + shell_quote(v);
  for (const auto& [k, v] : extra_env) cmd += " " + k + "=" + shell_quote(v);
  for (size_t i = 0; i < spec.args.size(); ++i) {
    std::string a = spec.args[i];
    if (i == 0) a = testing::bin_dir() + "/" + a;
    if (i > 0 && spec.args[i - 1] == "--config") a = config;
    cmd += " " + shell_quote(a);
  }
  for (const std::string& a : extra_args) cmd += " " + shell_quote(a);
  const std::string body = restart ? "while :; do " + cmd + "; echo \"[pod] exited with $?, restarting\"; sleep 0.3; done"
                                   : cmd + "; echo \"[pod] exited with $?\"";
  // A UTS namespace of its own, so the pod has its own hostname, and a mount namespace with a
  // /dev/shm of its own, as a pod has: ranks on different "hosts" share no shared memory, so
  // worker.collectives auto picks Gloo.
  return "exec unshare --uts --mount /bin/sh -c " +
         shell_quote("mount -t tmpfs -o size=64m tmpfs /dev/shm && hostname " + hostname + " && " + body);
}

struct Golden {
  std::vector<int32_t> prompt;
  std::vector<int32_t> greedy;
};

Golden golden_case(const std::string& model = "tiny-llama") {
  std::ifstream in(testing::fixtures_dir() + "/" + model + "/goldens/index.json");
  const auto g = nlohmann::json::parse(in)["cases"][2];
  return {g["prompt_ids"].get<std::vector<int32_t>>(), g["greedy_ids"].get<std::vector<int32_t>>()};
}

std::string completion_body(const std::vector<int32_t>& prompt, int max_tokens) {
  return nlohmann::json{{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0},
                        {"logprobs", 0}, {"ignore_eos", true}}
      .dump();
}

// The generated ids of a completion answer (the tiny fixtures have no tokenizer: "token_id:N").
std::vector<int32_t> token_ids(const std::string& body) {
  std::vector<int32_t> ids;
  auto j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.contains("choices")) return ids;
  for (const auto& t : j["choices"][0]["logprobs"]["tokens"]) {
    const std::string s = t.get<std::string>();
    if (s.rfind("token_id:", 0) == 0) ids.push_back(std::stoi(s.substr(9)));
  }
  return ids;
}

#define TESSERA_REQUIRE_NETNS()                                                                        \
  do {                                                                                                 \
    if (!ip_netns_available())                                                                         \
      GTEST_SKIP() << "SKIPPED: needs root and `ip netns` (iproute2) to build network namespaces";     \
    if (sh("command -v curl >/dev/null && command -v unshare >/dev/null").exit_code != 0)                                    \
      GTEST_SKIP() << "SKIPPED: needs curl and unshare";                                               \
  } while (0)

::testing::AssertionResult start_cluster(Cluster& cl, int workers) {
  remove_stale_namespaces();
  if (auto r = cl.make_switch(); !r) return r;
  if (auto r = cl.add_host("c", 1); !r) return r;
  for (int w = 0; w < workers; ++w) {
    if (auto r = cl.add_host("w" + std::to_string(w), 2 + w); !r) return r;
  }
  return ::testing::AssertionSuccess();
}

PodProcess& start_coordinator(Cluster& cl, const std::string& config) {
  return cl.start("c", "coordinator",
                  "exec " + shell_quote(testing::bin_dir() + "/tessera-coordinator") + " --config " + shell_quote(config));
}

TEST(MultiHost, FixtureTokensAcrossHostsAndALinkCutAndRestored) {
  TESSERA_REQUIRE_FIXTURES();
  TESSERA_REQUIRE_NETNS();
  Cluster cl("a");
  ASSERT_TRUE(start_cluster(cl, 2));
  const std::string config = write_config(cl.dir(), {});
  const WorkerSpec spec = statefulset_worker();
  PodProcess& coord = start_coordinator(cl, config);
  std::vector<PodProcess*> workers;
  for (int w = 0; w < 2; ++w) {
    workers.push_back(&cl.start("w" + std::to_string(w), "worker-" + std::to_string(w),
                                worker_script(spec, config, "tessera-worker-" + std::to_string(w), {}, true)));
  }
  const auto t0 = Clock::now();
  ASSERT_TRUE(wait_for([&] { return log_has(coord, "listening on http://0.0.0.0:8000"); }, 90s))
      << testing::read_file(coord.log) << testing::read_file(workers[1]->log);
  std::cout << "[ REPORT   ] group of 2 ready in " << std::chrono::duration<double>(Clock::now() - t0).count()
            << " s" << std::endl;
  // Each rank took its rank from its hostname and found the coordinator by its Service name.
  EXPECT_TRUE(log_has(*workers[1], "rank 1 of 2 (from the hostname 'tessera-worker-1'); coordinator at "
                                   "tcp://tessera-control:5560 (from worker.control_address)"))
      << testing::read_file(workers[1]->log);
  EXPECT_TRUE(log_has(coord, "rank 1 registered from host tessera-worker-1")) << testing::read_file(coord.log);
  // Each pod has its own /dev/shm: the ranks reduce over Gloo, each listening on its pod's address.
  for (int w = 0; w < 2; ++w) {
    EXPECT_TRUE(log_has(*workers[w], "rank " + std::to_string(w) +
                                         "/2: collectives over gloo (the ranks do not share one /dev/shm)"))
        << testing::read_file(workers[w]->log);
    EXPECT_TRUE(log_has(*workers[w], "addr=[10.213.0." + std::to_string(2 + w) + "]")) << testing::read_file(workers[w]->log);
  }

  const Golden g = golden_case();
  auto [code, body] = cl.http("POST", "/v1/completions", completion_body(g.prompt, g.greedy.size()));
  ASSERT_EQ(code, 200) << body;
  EXPECT_EQ(token_ids(body), g.greedy) << body;
  EXPECT_EQ(cl.http("GET", "/ready").first, 200);
  const std::string metrics = cl.http("GET", "/metrics").second;
  EXPECT_NE(metrics.find("tessera:collectives_info{model_name=\"tiny-llama\",kind=\"gloo\"} 1"), std::string::npos) << metrics;

  // Cut worker 1's link while a long request runs.
  std::string inflight_body;
  int inflight_code = 0;
  std::thread inflight([&] {
    std::tie(inflight_code, inflight_body) = cl.http("POST", "/v1/completions", completion_body(g.prompt, 1900));
  });
  std::this_thread::sleep_for(300ms);
  const auto cut = Clock::now();
  ASSERT_TRUE(cl.set_link("w1", false));
  inflight.join();
  const double failed_after = std::chrono::duration<double>(Clock::now() - cut).count();
  // A lost rank is the workers' failure, not the request's: 503 (Retry-After), never 500.
  EXPECT_EQ(inflight_code, 503) << inflight_body;
  // It names the lost rank: as the group saw it ("rank 1 died ...") or as rank 0's all-reduce
  // did ("... missing rank(s) 1 ..."), whichever noticed first.
  EXPECT_TRUE(inflight_body.find("rank 1") != std::string::npos || inflight_body.find("rank(s) 1") != std::string::npos)
      << inflight_body;
  std::cout << "[ REPORT   ] in-flight request failed " << failed_after << " s after the cut: " << inflight_body
            << std::endl;
  // /ready says the group is incomplete within a few heartbeats (the sanitized build's times
  // kSlowdown); /health stays up (liveness).
  EXPECT_TRUE(wait_for([&] { return cl.http("GET", "/ready").first == 503; },
                       std::chrono::milliseconds(static_cast<int>(5 * kHeartbeatMs * testing::kSlowdown))));
  EXPECT_EQ(cl.http("GET", "/health").first, 200);
  auto [refused_code, refused] = cl.http("POST", "/v1/completions", completion_body(g.prompt, 4));
  EXPECT_NE(refused_code, 200);
  EXPECT_NE(refused.find("incomplete"), std::string::npos) << refused;
  std::cout << "[ REPORT   ] while cut: HTTP " << refused_code << " " << refused << std::endl;
  // Worker 1 presumes its coordinator dead and leaves; its "kubelet" restarts it.
  EXPECT_TRUE(wait_for([&] { return log_has(*workers[1], "presuming it dead, leaving"); }, 10s))
      << testing::read_file(workers[1]->log);

  // Restore the link: the restarted rank registers again and service resumes.
  ASSERT_TRUE(cl.set_link("w1", true));
  const auto restored = Clock::now();
  EXPECT_TRUE(wait_for([&] { return cl.http("GET", "/ready").first == 200; }, 60s))
      << testing::read_file(coord.log) << testing::read_file(workers[1]->log);
  std::cout << "[ REPORT   ] ready again " << std::chrono::duration<double>(Clock::now() - restored).count()
            << " s after the link came back" << std::endl;
  std::tie(code, body) = cl.http("POST", "/v1/completions", completion_body(g.prompt, g.greedy.size()));
  ASSERT_EQ(code, 200) << body;
  EXPECT_EQ(token_ids(body), g.greedy) << body;
}

// A rank whose Gloo address its peer cannot reach: rank 1 listens on an address of its own
// (10.99.0.1, on its eth0) that rank 0's namespace has no route to. Rank 0 reports the
// address it could not reach, and set-up fails instead of hanging.
TEST(MultiHost, AGlooAddressAPeerCannotReachIsNamed) {
  TESSERA_REQUIRE_FIXTURES();
  TESSERA_REQUIRE_NETNS();
  Cluster cl("g");
  ASSERT_TRUE(start_cluster(cl, 2));
  ASSERT_EQ(sh("ip -n " + cl.ns("w1") + " addr add 10.99.0.1/32 dev eth0").exit_code, 0);
  const std::string config = write_config(cl.dir(), {});
  const WorkerSpec spec = statefulset_worker();
  PodProcess& coord = start_coordinator(cl, config);
  PodProcess& w0 = cl.start("w0", "worker-0", worker_script(spec, config, "tessera-worker-0", {}, false));
  PodProcess& w1 = cl.start("w1", "worker-1",
                            worker_script(spec, config, "tessera-worker-1",
                                          {"--set", "worker.collectives_address=10.99.0.1"}, false));
  EXPECT_TRUE(wait_for([&] { return log_has(w0, "could not connect to its peers"); }, 40s))
      << testing::read_file(w0.log) << testing::read_file(w1.log) << testing::read_file(coord.log);
  EXPECT_TRUE(log_has(w0, "the peers' addresses for this rank: rank 1 at 10.99.0.1:")) << testing::read_file(w0.log);
  EXPECT_TRUE(log_has(w1, "gloo: rank 1/2 listens on address 10.99.0.1")) << testing::read_file(w1.log);
}

// Three ranks on three "hosts" (tiny-bloom: 6 heads, so 3 ranks divide it; an uneven vocabulary
// split): the goldens over Gloo.
TEST(MultiHost, ThreeRanksOverGlooGiveTheGoldens) {
  TESSERA_REQUIRE_FIXTURES();
  TESSERA_REQUIRE_NETNS();
  Cluster cl("t");
  ASSERT_TRUE(start_cluster(cl, 3));
  const std::string config = write_config(cl.dir(), {{"model.path", testing::fixtures_dir() + "/tiny-bloom"},
                                                     {"parallel.tensor_parallel", "3"}}, 3);
  const WorkerSpec spec = statefulset_worker();
  PodProcess& coord = start_coordinator(cl, config);
  std::vector<PodProcess*> workers;
  for (int w = 0; w < 3; ++w)
    workers.push_back(&cl.start("w" + std::to_string(w), "worker-" + std::to_string(w),
                                worker_script(spec, config, "tessera-worker-" + std::to_string(w), {}, true)));
  ASSERT_TRUE(wait_for([&] { return log_has(coord, "listening on http://0.0.0.0:8000"); }, 90s))
      << testing::read_file(coord.log) << testing::read_file(workers[2]->log);
  for (int w = 0; w < 3; ++w)
    EXPECT_TRUE(log_has(*workers[w], "rank " + std::to_string(w) + "/3: collectives over gloo")) << testing::read_file(workers[w]->log);
  const Golden g = golden_case("tiny-bloom");
  auto [code, body] = cl.http("POST", "/v1/completions", completion_body(g.prompt, g.greedy.size()));
  ASSERT_EQ(code, 200) << body;
  EXPECT_EQ(token_ids(body), g.greedy) << body;
}

TEST(MultiHost, CurveAllowListRefusesAWrongKeyAndTheGroupServes) {
  TESSERA_REQUIRE_FIXTURES();
  TESSERA_REQUIRE_NETNS();
  Cluster cl("b");
  ASSERT_TRUE(start_cluster(cl, 3));
  // Keys as docs/deployment.md makes them: the coordinator's, the workers', an intruder's.
  const std::string keys = cl.dir() + "/curve";
  fs::create_directories(keys);
  for (const std::string name : {"server", "worker", "intruder"}) {
    auto r = sh(testing::bin_dir() + "/tessera-curve-keygen --out " + keys + "/" + name);
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  fs::copy_file(keys + "/worker.pub", keys + "/allowed_clients");
  const std::string config = write_config(cl.dir(), {{"server.curve.enabled", "true"},
                                                     {"server.curve.server_public_key_file", keys + "/server.pub"},
                                                     {"server.curve.server_secret_key_file", keys + "/server.key"},
                                                     {"server.curve.client_secret_key_file", keys + "/worker.key"},
                                                     {"server.curve.allowed_client_keys_file", keys + "/allowed_clients"}});
  const WorkerSpec spec = statefulset_worker();
  PodProcess& coord = start_coordinator(cl, config);
  std::vector<PodProcess*> workers;
  for (int w = 0; w < 2; ++w) {
    workers.push_back(&cl.start("w" + std::to_string(w), "worker-" + std::to_string(w),
                                worker_script(spec, config, "tessera-worker-" + std::to_string(w), {}, true)));
  }
  ASSERT_TRUE(wait_for([&] { return log_has(coord, "listening on http://0.0.0.0:8000"); }, 90s))
      << testing::read_file(coord.log) << testing::read_file(workers[0]->log);
  EXPECT_TRUE(log_has(coord, "CURVE on (1 allowed worker key(s))")) << testing::read_file(coord.log);
  const Golden g = golden_case();
  auto [code, body] = cl.http("POST", "/v1/completions", completion_body(g.prompt, g.greedy.size()));
  ASSERT_EQ(code, 200) << body;
  EXPECT_EQ(token_ids(body), g.greedy) << body;

  // An intruder on a third host: the server's public key, a keypair of its own, rank 1 by
  // TESSERA_RANK. Refused in the handshake; it says so and exits.
  PodProcess& intruder =
      cl.start("w2", "intruder",
               worker_script(spec, config, "intruder", {"--set", "server.curve.client_secret_key_file=" + keys + "/intruder.key"},
                             false, {{"TESSERA_RANK", "1"}}));
  const std::string intruder_pub = testing::read_file(keys + "/intruder.pub").substr(0, 40);
  EXPECT_TRUE(wait_for([&] { return log_has(intruder, "[pod] exited with 1"); }, 20s)) << testing::read_file(intruder.log);
  EXPECT_TRUE(log_has(intruder, "refused this worker's CURVE key " + intruder_pub)) << testing::read_file(intruder.log);
  EXPECT_TRUE(log_has(coord, "refused a CURVE client from 10.213.0.4: its public key " + intruder_pub))
      << testing::read_file(coord.log);
  EXPECT_FALSE(log_has(coord, "from host intruder")) << "the intruder registered";

  // The group still serves, still whole.
  EXPECT_EQ(cl.http("GET", "/ready").first, 200);
  std::tie(code, body) = cl.http("POST", "/v1/completions", completion_body(g.prompt, g.greedy.size()));
  ASSERT_EQ(code, 200) << body;
  EXPECT_EQ(token_ids(body), g.greedy) << body;
}

}  // namespace
}  // namespace tessera
