#pragma once
// OpenAI's Batch API on a running server: files uploaded to /v1/files, batches created on them
// with /v1/batches and run one at a time beside the online traffic (through the same engine),
// their results written as files. Everything lives under server.batch_dir, so a restart finds
// the files and batches; a batch the restart (or a shutdown) cut is reported `failed` with the
// results it had. The transport only routes requests here (coordinator/server).
#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "coordinator/api/openai_api.h"
#include "coordinator/engine/engine_service.h"

namespace tessera {

// A response as the transport sends it.
struct ApiReply {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
};

class BatchStore {
 public:
  // Opens `dir` (creating it); batches a previous process left running are marked failed.
  static StatusOr<std::unique_ptr<BatchStore>> open(const std::string& dir, EngineService& service, ApiContext api);
  ~BatchStore();
  BatchStore(const BatchStore&) = delete;
  BatchStore& operator=(const BatchStore&) = delete;

  // Stops the batch that runs (its running requests are cut; it is marked failed with code
  // server_stopped) and the runner; later batch requests get 503.
  void shut_down();

  ApiReply upload_file(std::string_view content_type, std::string_view body);
  ApiReply list_files();
  ApiReply get_file(const std::string& id);
  ApiReply file_content(const std::string& id);
  ApiReply delete_file(const std::string& id);
  ApiReply create_batch(std::string_view body);
  ApiReply list_batches();
  ApiReply get_batch(const std::string& id);
  ApiReply cancel_batch(const std::string& id);

 private:
  using json = nlohmann::ordered_json;
  BatchStore(std::string dir, EngineService& service, ApiContext api);
  Status load();
  void run();
  void run_one(const std::string& id);
  // Under mu_: writes the batch's object to its file.
  void save_batch(const json& batch);
  void save_file_meta(const json& meta);
  std::string file_path(const std::string& id) const;
  json new_file_meta(const std::string& filename, const std::string& purpose, int64_t bytes);

  const std::string dir_;
  EngineService& service_;
  const ApiContext api_;

  std::mutex mu_;  // guards what follows
  std::condition_variable cv_;
  std::map<std::string, json> files_;    // metadata by id
  std::map<std::string, json> batches_;  // by id
  std::deque<std::string> queue_;        // batches waiting to run
  std::string running_;                  // the batch that runs ("" none)
  bool stopping_ = false;
  std::atomic<bool> cancel_running_{false};
  std::thread runner_;
};

}  // namespace tessera
