#pragma once
// A real tessera-serve child process for the out-of-process service tests: `--port 0`, its
// own ipc:// control and ZeroMQ-client endpoints in a fresh temp folder (tests running in
// parallel never collide), ready once it logs "listening on http://127.0.0.1:PORT" (or another
// line, set_ready_line).
// Destroying it drains it with SIGTERM (SIGKILL if that takes over 60 s).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <string.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fcntl.h>
#include <filesystem>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/test_support.h"

namespace tessera::testing {

// One HTTP/1.1 request with Connection: close (and `headers`, "Name: value\r\n" lines);
// returns the raw response.
inline std::string http(int port, const std::string& method, const std::string& path, const std::string& body = "",
                        const std::string& headers = "") {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  req += headers;
  if (!body.empty()) req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  req += "\r\n" + body;
  (void)!write(fd, req.data(), req.size());
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) out.append(buf, n);
  close(fd);
  return out;
}


class ServeProcess {
 public:
  ServeProcess() = default;
  ServeProcess(const ServeProcess&) = delete;
  ServeProcess& operator=(const ServeProcess&) = delete;
  ~ServeProcess() {
    stop();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // Starts `tessera-serve --port 0 ...endpoints... extra...` and waits up to `timeout` for
  // its listening line. False (with log() telling why) when it exits or never gets ready.
  bool start(const std::vector<std::string>& extra, std::chrono::seconds timeout = std::chrono::seconds(120)) {
    dir_ = make_temp_dir("tessera-serve-child");
    zmq_endpoint_ = "ipc://" + dir_ + "/client.ipc";
    log_path_ = dir_ + "/serve.log";
    // Everything the child needs is built before fork: the test process may have threads.
    std::vector<std::string> args = {bin_dir() + "/tessera-serve", "--port", "0"};
    if (own_endpoints_) {
      args.insert(args.end(), {"--set", "server.control=ipc://" + dir_ + "/control.ipc", "--set",
                               "server.zmq_client=" + zmq_endpoint_});
    } else {
      zmq_endpoint_.clear();  // tessera-serve chooses (its log says which)
    }
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> env_strings = env_;  // first: getenv() takes the first match
    for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
    std::vector<char*> envp;
    for (std::string& e : env_strings) envp.push_back(e.data());
    envp.push_back(nullptr);
    const int log_fd = ::open(log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (log_fd < 0) return false;
    const rlim_t fd_limit = fd_limit_;
    pid_ = fork();
    if (pid_ == 0) {
      alarm(280);  // a stuck server must not outlive the test (ctest's limit is 300 s)
      if (fd_limit > 0) {
        const rlimit rl{fd_limit, fd_limit};
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0) _exit(126);
      }
      dup2(log_fd, STDERR_FILENO);
      const int null_fd = ::open("/dev/null", O_WRONLY);
      if (null_fd >= 0) dup2(null_fd, STDOUT_FILENO);
      execve(argv[0], argv.data(), envp.data());
      _exit(127);
    }
    ::close(log_fd);
    if (pid_ < 0) return false;
    const std::regex listening(ready_line_);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      std::smatch m;
      const std::string text = log();
      if (std::regex_search(text, m, listening)) {
        port_ = std::stoi(m[1]);
        return true;
      }
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

  // SIGTERM and wait; the exit status as waitpid gives it (-1 when not running).
  int stop() {
    if (pid_ <= 0) return -1;
    kill(pid_, SIGTERM);
    int status = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (waitpid(pid_, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    pid_ = -1;
    return status;
  }

  // Sends `sig` once (no second signal, unlike stop()).
  void signal(int sig) const {
    if (pid_ > 0) kill(pid_, sig);
  }
  // Waits up to `timeout` for the process to exit: the waitpid status, or -1 when it is still
  // running (or was not).
  int wait_exit(std::chrono::milliseconds timeout) {
    if (pid_ <= 0) return -1;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    int status = 0;
    while (waitpid(pid_, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    pid_ = -1;
    return status;
  }
  // A wait_exit() status in words: "exit 0", "exit 3", "killed by signal 11 (Segmentation fault)", "still running".
  static std::string describe_exit(int status) {
    if (status == -1) return "still running";
    if (WIFEXITED(status)) return "exit " + std::to_string(WEXITSTATUS(status));
    if (WIFSIGNALED(status)) {
      return "killed by signal " + std::to_string(WTERMSIG(status)) + " (" + strsignal(WTERMSIG(status)) + ")";
    }
    return "status " + std::to_string(status);
  }
  // RLIMIT_NOFILE (soft and hard) of the server child started next; 0 = inherited.
  void set_fd_limit(rlim_t limit) { fd_limit_ = limit; }
  // Before start(): leave server.control and server.zmq_client to tessera-serve's defaults
  // (free ports) instead of this fixture's private ipc:// endpoints.
  void use_default_endpoints() { own_endpoints_ = false; }
  // Before start(): the log line (a regex, its first group the port) start() waits for, in
  // place of "listening on ..." (e.g. the earlier "taking requests on ..." of a server that
  // still warms up).
  void set_ready_line(const std::string& regex) { ready_line_ = regex; }
  // Before start(): NAME=VALUE in the child's environment, over the test's own.
  void set_env(const std::string& name, const std::string& value) { env_.push_back(name + "=" + value); }

  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  const std::string& zmq_endpoint() const { return zmq_endpoint_; }
  const std::string& dir() const { return dir_; }
  std::string log() const { return read_file(log_path_); }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  rlim_t fd_limit_ = 0;
  std::string dir_, zmq_endpoint_, log_path_;
  bool own_endpoints_ = true;
  std::string ready_line_ = "listening on http://127\\.0\\.0\\.1:(\\d+)";
  std::vector<std::string> env_;
};

// The status code of a raw HTTP response (0 when it is not one).
inline int http_status(const std::string& response) {
  return response.rfind("HTTP/1.1 ", 0) == 0 ? std::atoi(response.c_str() + 9) : 0;
}

// The body of a raw HTTP response ("" when there is none).
inline std::string http_body(const std::string& response) {
  const size_t at = response.find("\r\n\r\n");
  return at == std::string::npos ? "" : response.substr(at + 4);
}

// Writes a CURVE keypair DIR/server.pub, DIR/server.key (tessera-curve-keygen) and returns the
// tessera-serve arguments that encrypt the ZeroMQ client API with it (server.curve.client_api);
// empty when the keygen fails. Clients then need DIR/server.pub.
inline std::vector<std::string> curve_client_api_args(const std::string& dir) {
  if (run_command(bin_dir() + "/tessera-curve-keygen --out " + dir + "/server").exit_code != 0) return {};
  return {"--set", "server.curve.enabled=true", "--set", "server.curve.client_api=true",
          "--set", "server.curve.server_public_key_file=" + dir + "/server.pub",
          "--set", "server.curve.server_secret_key_file=" + dir + "/server.key"};
}

// The arguments that serve tiny-llama in float32 on the CPU backend with one thread, then `extra`.
// The running worker process of `server` for `rank` (its child started with --rank R).
inline pid_t worker_pid(const ServeProcess& server, int rank) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = read_file(entry.path().string() + "/stat");
    const size_t paren = stat.rfind(')');
    if (paren == std::string::npos) continue;
    std::istringstream rest(stat.substr(paren + 1));
    std::string state;
    pid_t ppid = 0;
    if (!(rest >> state >> ppid) || ppid != server.pid() || state == "Z") continue;
    // argv, NUL-separated: "... --rank R ...".
    const std::string cmdline = read_file(entry.path().string() + "/cmdline") + std::string(1, '\0');
    const std::string want = std::string("--rank") + '\0' + std::to_string(rank) + '\0';
    if (cmdline.find(want) != std::string::npos) return static_cast<pid_t>(std::stol(name));
  }
  return -1;
}

inline std::vector<std::string> tiny_llama_cpu_args(std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"--model", fixtures_dir() + "/tiny-llama", "--dtype", "float32",
                                   "--backend", "cpu", "--threads", "1"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// 'text' quoted for /bin/sh.
inline std::string shell_quote(const std::string& text) {
  std::string out = "'";
  for (char c : text) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

// The processes whose parent is `pid` (the workers a tessera-serve started), from /proc/*/stat.
inline std::vector<pid_t> children_of(pid_t pid) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = read_file(entry.path().string() + "/stat");
    const size_t paren = stat.rfind(')');  // "pid (comm) state ppid ..."
    if (paren == std::string::npos) continue;
    std::istringstream rest(stat.substr(paren + 1));
    std::string state;
    pid_t ppid = 0;
    if (rest >> state >> ppid && ppid == pid) out.push_back(static_cast<pid_t>(std::stol(name)));
  }
  return out;
}

// A test suite that shares one tessera-serve child on the kjv-llama fixture (default
// settings, CPU workers), started once for the whole suite and stopped after it. Each test
// skips visibly without the fixtures; a server that does not start fails the suite with its
// log. Suites run one after another, so the one static server serves each suite in turn.
class KjvServeSuite : public ::testing::Test {
 protected:
  static std::string kjv_model() { return fixtures_dir() + "/kjv-llama"; }
  static void SetUpTestSuite() {
    if (fixtures_dir().empty()) return;
    server_ = std::make_unique<ServeProcess>();
    if (!server_->start({"--model", kjv_model()})) {
      ADD_FAILURE() << "tessera-serve did not start:\n" << server_->log();
      server_.reset();
    }
  }
  static void TearDownTestSuite() { server_.reset(); }
  void SetUp() override {
    TESSERA_REQUIRE_FIXTURES();
    ASSERT_TRUE(server_ != nullptr);
  }

  static inline std::unique_ptr<ServeProcess> server_;
};

}  // namespace tessera::testing
