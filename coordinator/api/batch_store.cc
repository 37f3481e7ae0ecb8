#include "coordinator/api/batch_store.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <optional>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "common/logging.h"
#include "coordinator/api/api_error.h"
#include "coordinator/api/api_submission.h"
#include "coordinator/api/batch_jsonl.h"
#include "coordinator/api/multipart_form.h"

namespace tessera {

// (Named: in a unity build an anonymous namespace is shared with the other API files.)
namespace batch_store_internal {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

int64_t now_s() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string new_id(const char* prefix) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%s%016llx", prefix, static_cast<unsigned long long>(rng()));
  return buf;
}

// Ids come from URLs: only what new_id makes may name a file under the folder.
bool well_formed_id(const std::string& id) {
  if (id.empty() || id.size() > 64) return false;
  for (char c : id)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') return false;
  return true;
}

ApiReply error_reply(int status, const std::string& code, const std::string& message, const std::string& param = "") {
  const ApiError e = api_error(status, status >= 500 ? "server_error" : "invalid_request_error", code, message, param);
  return ApiReply{status, "application/json", error_body(e)};
}

ApiReply json_reply(const json& j) { return ApiReply{200, "application/json", j.dump()}; }

ApiReply list_reply(const std::map<std::string, json>& objects) {
  json data = json::array();
  for (const auto& [id, object] : objects) data.push_back(object);
  return json_reply(json{{"object", "list"}, {"data", std::move(data)}});
}

bool write_whole(const std::string& path, std::string_view data) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return false;
    f.write(data.data(), static_cast<std::streamsize>(data.size()));
    if (!f) return false;
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);  // whole or not at all: a crash never leaves half a record
  return !ec;
}

std::optional<json> read_json_file(const fs::path& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  json j = json::parse(ss.str(), nullptr, false);
  if (!f || j.is_discarded() || !j.is_object()) return std::nullopt;
  return j;
}

int64_t count_lines(const std::string& path) {
  std::ifstream f(path);
  int64_t n = 0;
  for (std::string line; std::getline(f, line);)
    if (line.find_first_not_of(" \t\r") != std::string::npos) ++n;
  return n;
}

bool unfinished(const json& batch) {
  const std::string s = batch.value("status", "");
  return s == "validating" || s == "in_progress" || s == "finalizing" || s == "cancelling";
}

json batch_errors(const std::string& code, const std::string& message) {
  return json{{"object", "list"},
              {"data", json::array({json{{"code", code}, {"message", message}, {"param", nullptr}, {"line", nullptr}}})}};
}

// Ends a batch that was cut before it finished: failed, saying how many requests have results
// (its request_counts).
void fail_cut_batch(json& batch, const std::string& code, const std::string& why) {
  const json& counts = batch["request_counts"];
  const int64_t results = counts.value("completed", int64_t{0}) + counts.value("failed", int64_t{0});
  batch["status"] = "failed";
  batch["failed_at"] = now_s();
  batch["errors"] = batch_errors(code, why + "; " + std::to_string(results) + " of " +
                                          std::to_string(counts.value("total", int64_t{0})) +
                                          " requests have results (output_file_id, error_file_id)");
}

}  // namespace batch_store_internal

namespace bsi = batch_store_internal;
namespace fs = std::filesystem;

BatchStore::BatchStore(std::string dir, EngineService& service, ApiContext api)
    : dir_(std::move(dir)), service_(service), api_(std::move(api)) {}

StatusOr<std::unique_ptr<BatchStore>> BatchStore::open(const std::string& dir, EngineService& service, ApiContext api) {
  std::unique_ptr<BatchStore> store(new BatchStore(dir, service, std::move(api)));
  TESSERA_RETURN_IF_ERROR(store->load());
  store->runner_ = std::thread([s = store.get()] { s->run(); });
  return store;
}

Status BatchStore::load() {
  std::error_code ec;
  for (const char* sub : {"files", "batches"}) {
    fs::create_directories(fs::path(dir_) / sub, ec);
    if (ec) return invalid_argument("server.batch_dir: cannot create '" + (fs::path(dir_) / sub).string() + "': " + ec.message());
  }
  const std::string probe = (fs::path(dir_) / "batches" / ".writable").string();
  if (!bsi::write_whole(probe, "")) return invalid_argument("server.batch_dir: '" + dir_ + "' is not writable");
  fs::remove(probe, ec);
  for (const auto& entry : fs::directory_iterator(fs::path(dir_) / "files")) {
    if (entry.path().extension() != ".json") continue;
    std::optional<json> meta = bsi::read_json_file(entry.path());
    if (!meta || !meta->value("id", json()).is_string()) {
      TESSERA_LOG_WARN("[coord] batch API: {} is not a file record: skipped", entry.path().string());
      continue;
    }
    const std::string id = (*meta)["id"];  // (before the move below: the operands' order is not the reader's)
    files_[id] = std::move(*meta);
  }
  for (const auto& entry : fs::directory_iterator(fs::path(dir_) / "batches")) {
    if (entry.path().extension() != ".json") continue;
    std::optional<json> batch = bsi::read_json_file(entry.path());
    if (!batch || !batch->value("id", json()).is_string() || !batch->value("request_counts", json()).is_object()) {
      TESSERA_LOG_WARN("[coord] batch API: {} is not a batch record: skipped", entry.path().string());
      continue;
    }
    const std::string id = (*batch)["id"];
    if (bsi::unfinished(*batch)) {
      // The counts saved last may lag behind the lines written: the files tell.
      const auto output = batch->value("output_file_id", json()), errors = batch->value("error_file_id", json());
      (*batch)["request_counts"]["completed"] = output.is_string() ? bsi::count_lines(file_path(output)) : 0;
      (*batch)["request_counts"]["failed"] = errors.is_string() ? bsi::count_lines(file_path(errors)) : 0;
      bsi::fail_cut_batch(*batch, "server_restarted", "the server stopped while this batch ran");
      TESSERA_LOG_WARN("[coord] batch {} was cut by a restart: marked failed", id);
      save_batch(*batch);
    }
    batches_[id] = std::move(*batch);
  }
  TESSERA_LOG_INFO("[coord] batch API: {} file(s) and {} batch(es) in {}", files_.size(), batches_.size(), dir_);
  return Status::ok();
}

BatchStore::~BatchStore() { shut_down(); }

void BatchStore::shut_down() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cancel_running_.store(true);
  cv_.notify_all();
  if (runner_.joinable()) runner_.join();
}

std::string BatchStore::file_path(const std::string& id) const { return (fs::path(dir_) / "files" / (id + ".data")).string(); }

void BatchStore::save_batch(const json& batch) {
  const std::string path = (fs::path(dir_) / "batches" / (batch["id"].get<std::string>() + ".json")).string();
  if (!bsi::write_whole(path, batch.dump())) TESSERA_LOG_ERROR("[coord] batch API: cannot write {}", path);
}

void BatchStore::save_file_meta(const json& meta) {
  const std::string path = (fs::path(dir_) / "files" / (meta["id"].get<std::string>() + ".json")).string();
  if (!bsi::write_whole(path, meta.dump())) TESSERA_LOG_ERROR("[coord] batch API: cannot write {}", path);
}

BatchStore::json BatchStore::new_file_meta(const std::string& filename, const std::string& purpose, int64_t bytes) {
  return json{{"id", bsi::new_id("file-")}, {"object", "file"},     {"bytes", bytes},
              {"created_at", bsi::now_s()}, {"filename", filename}, {"purpose", purpose}};
}

ApiReply BatchStore::upload_file(std::string_view content_type, std::string_view body) {
  StatusOr<std::map<std::string, FormPart>> form = parse_multipart_form(content_type, body);
  if (!form.is_ok()) return bsi::error_reply(400, "invalid_multipart", form.status().message());
  const auto purpose = form->find("purpose");
  if (purpose == form->end()) return bsi::error_reply(400, "missing_purpose", "the form has no 'purpose' part", "purpose");
  if (purpose->second.content != "batch")
    return bsi::error_reply(400, "invalid_purpose", "'purpose' must be \"batch\" (got \"" + purpose->second.content + "\")", "purpose");
  const auto file = form->find("file");
  if (file == form->end()) return bsi::error_reply(400, "missing_file", "the form has no 'file' part", "file");
  json meta = new_file_meta(file->second.filename.empty() ? "upload.jsonl" : file->second.filename, "batch",
                            static_cast<int64_t>(file->second.content.size()));
  const std::string id = meta["id"];
  if (!bsi::write_whole(file_path(id), file->second.content))
    return bsi::error_reply(500, "storage_error", "the file could not be stored under server.batch_dir");
  std::lock_guard<std::mutex> lock(mu_);
  save_file_meta(meta);
  files_[id] = meta;
  return bsi::json_reply(meta);
}

ApiReply BatchStore::list_files() {
  std::lock_guard<std::mutex> lock(mu_);
  return bsi::list_reply(files_);
}

ApiReply BatchStore::get_file(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = bsi::well_formed_id(id) ? files_.find(id) : files_.end();
  if (it == files_.end()) return bsi::error_reply(404, "file_not_found", "no file '" + id + "'");
  return bsi::json_reply(it->second);
}

ApiReply BatchStore::file_content(const std::string& id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!bsi::well_formed_id(id) || !files_.count(id)) return bsi::error_reply(404, "file_not_found", "no file '" + id + "'");
  }
  std::ifstream f(file_path(id), std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  if (!f) return bsi::error_reply(500, "storage_error", "file '" + id + "' cannot be read");
  return ApiReply{200, "application/jsonl", ss.str()};
}

ApiReply BatchStore::delete_file(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!bsi::well_formed_id(id) || !files_.count(id)) return bsi::error_reply(404, "file_not_found", "no file '" + id + "'");
  for (const auto& [bid, batch] : batches_) {
    if (bsi::unfinished(batch) && (batch["input_file_id"] == id || batch.value("output_file_id", json()) == id ||
                              batch.value("error_file_id", json()) == id))
      return bsi::error_reply(409, "file_in_use", "file '" + id + "' belongs to batch '" + bid + "', which has not ended");
  }
  std::error_code ec;
  fs::remove(file_path(id), ec);
  fs::remove(fs::path(dir_) / "files" / (id + ".json"), ec);
  files_.erase(id);
  return bsi::json_reply(json{{"id", id}, {"object", "file"}, {"deleted", true}});
}

ApiReply BatchStore::create_batch(std::string_view body) {
  const json j = json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return bsi::error_reply(400, "invalid_json", "the body must be a JSON object");
  const auto input = j.find("input_file_id");
  if (input == j.end() || !input->is_string())
    return bsi::error_reply(400, "invalid_value", "'input_file_id' must be a string", "input_file_id");
  const auto endpoint = j.find("endpoint");
  if (endpoint == j.end() || !endpoint->is_string() ||
      (*endpoint != "/v1/completions" && *endpoint != "/v1/chat/completions" && *endpoint != "/v1/embeddings"))
    return bsi::error_reply(400, "invalid_value",
                       "'endpoint' must be one of /v1/completions, /v1/chat/completions, /v1/embeddings", "endpoint");
  const json window = j.value("completion_window", json("24h"));
  if (window != "24h") return bsi::error_reply(400, "invalid_value", "'completion_window' must be \"24h\"", "completion_window");
  const json metadata = j.value("metadata", json());
  if (!metadata.is_null() && (!metadata.is_object() || metadata.size() > 16))
    return bsi::error_reply(400, "invalid_value", "'metadata' must be an object of at most 16 pairs", "metadata");
  const std::string file_id = *input;
  // Read before taking the lock (a large file must not hold up the other routes); a file that
  // is not there counts nothing and is refused below.
  const int64_t total = bsi::well_formed_id(file_id) ? bsi::count_lines(file_path(file_id)) : 0;
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return bsi::error_reply(503, "draining", "the server is shutting down");
  const auto file = bsi::well_formed_id(file_id) ? files_.find(file_id) : files_.end();
  if (file == files_.end()) return bsi::error_reply(404, "file_not_found", "no file '" + file_id + "'", "input_file_id");
  if (file->second["purpose"] != "batch")
    return bsi::error_reply(400, "invalid_value", "file '" + file_id + "' is not a batch input (purpose \"batch\")", "input_file_id");
  json batch = {{"id", bsi::new_id("batch_")},
                {"object", "batch"},
                {"endpoint", *endpoint},
                {"errors", nullptr},
                {"input_file_id", file_id},
                {"completion_window", "24h"},
                {"status", "validating"},
                {"output_file_id", nullptr},
                {"error_file_id", nullptr},
                {"created_at", bsi::now_s()},
                {"in_progress_at", nullptr},
                {"completed_at", nullptr},
                {"failed_at", nullptr},
                {"cancelled_at", nullptr},
                {"request_counts", {{"total", total}, {"completed", 0}, {"failed", 0}}},
                {"metadata", metadata}};
  save_batch(batch);
  batches_[batch["id"]] = batch;
  queue_.push_back(batch["id"]);
  cv_.notify_all();
  return bsi::json_reply(batch);
}

ApiReply BatchStore::list_batches() {
  std::lock_guard<std::mutex> lock(mu_);
  return bsi::list_reply(batches_);
}

ApiReply BatchStore::get_batch(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = bsi::well_formed_id(id) ? batches_.find(id) : batches_.end();
  if (it == batches_.end()) return bsi::error_reply(404, "batch_not_found", "no batch '" + id + "'");
  return bsi::json_reply(it->second);
}

ApiReply BatchStore::cancel_batch(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = bsi::well_formed_id(id) ? batches_.find(id) : batches_.end();
  if (it == batches_.end()) return bsi::error_reply(404, "batch_not_found", "no batch '" + id + "'");
  json& batch = it->second;
  if (!bsi::unfinished(batch))
    return bsi::error_reply(409, "batch_ended", "batch '" + id + "' has already ended (" + batch["status"].get<std::string>() + ")");
  if (running_ == id) {
    batch["status"] = "cancelling";
    cancel_running_.store(true);
  } else if (batch["status"] == "validating") {
    std::erase(queue_, id);
    batch["status"] = "cancelled";
    batch["cancelled_at"] = bsi::now_s();
  }
  save_batch(batch);
  return bsi::json_reply(batch);
}

void BatchStore::run() {
  for (;;) {
    std::string id;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      id = queue_.front();
      queue_.pop_front();
      running_ = id;
      cancel_running_.store(false);
    }
    run_one(id);
    std::lock_guard<std::mutex> lock(mu_);
    running_.clear();
  }
}

void BatchStore::run_one(const std::string& id) {
  json output_meta = new_file_meta(id + "_output.jsonl", "batch_output", 0);
  json error_meta = new_file_meta(id + "_error.jsonl", "batch_output", 0);
  std::string input_id, endpoint;
  {
    std::lock_guard<std::mutex> lock(mu_);
    json& batch = batches_[id];
    input_id = batch["input_file_id"];
    endpoint = batch["endpoint"];
    batch["status"] = "in_progress";
    batch["in_progress_at"] = bsi::now_s();
    batch["output_file_id"] = output_meta["id"];
    batch["error_file_id"] = error_meta["id"];
    files_[output_meta["id"]] = output_meta;
    files_[error_meta["id"]] = error_meta;
    save_file_meta(output_meta);
    save_file_meta(error_meta);
    save_batch(batch);
  }
  std::ifstream in(file_path(input_id));
  std::ofstream out(file_path(output_meta["id"]), std::ios::trunc), errors(file_path(error_meta["id"]), std::ios::trunc);
  BatchRunOptions options;
  // Enough to fill the largest batch, within the engine queue's bound (online requests share it).
  options.max_in_flight = std::clamp(service_.max_queued_requests() / 2, 1, 512);
  options.cancel = &cancel_running_;
  options.only_url = endpoint;
  options.errors = &errors;
  options.progress_every = std::chrono::milliseconds(1000);
  options.on_progress = [this, &id](const BatchCounts& c) {
    std::lock_guard<std::mutex> lock(mu_);
    json& batch = batches_[id];
    batch["request_counts"]["completed"] = c.completed;
    batch["request_counts"]["failed"] = c.failed;
    const double eta = c.finished() > 0 ? c.seconds / static_cast<double>(c.finished()) *
                                              static_cast<double>(batch["request_counts"].value("total", 0) - c.finished())
                                        : -1.0;
    batch["tessera_progress"] = {{"completion_tokens", c.completion_tokens},
                                 {"tokens_per_second", c.seconds > 0 ? c.completion_tokens / c.seconds : 0.0},
                                 {"eta_seconds", eta >= 0 ? json(eta) : json(nullptr)}};
    save_batch(batch);
  };
  StatusOr<BatchCounts> result =
      !in ? StatusOr<BatchCounts>(Status(StatusCode::kDataLoss, "the input file cannot be read"))
          : run_batch_jsonl(service_, api_, in, out, options);
  out.close();
  errors.close();
  std::lock_guard<std::mutex> lock(mu_);
  json& batch = batches_[id];
  for (json* meta : {&output_meta, &error_meta}) {
    std::error_code ec;
    (*meta)["bytes"] = static_cast<int64_t>(fs::file_size(file_path((*meta)["id"]), ec));
    files_[(*meta)["id"]] = *meta;
    save_file_meta(*meta);
  }
  // request_counts are the run's last report (on_progress, called at its end however it ends).
  if (result.is_ok()) {
    batch["status"] = "completed";
    batch["completed_at"] = bsi::now_s();
  } else if (stopping_) {
    bsi::fail_cut_batch(batch, "server_stopped", "the server shut down while this batch ran");
  } else if (batch["status"] == "cancelling") {
    batch["status"] = "cancelled";
    batch["cancelled_at"] = bsi::now_s();
  } else {
    bsi::fail_cut_batch(batch, "batch_failed", result.status().message());
  }
  save_batch(batch);
  TESSERA_LOG_INFO("[coord] batch {} {}: {} completed, {} failed", id, batch["status"].get<std::string>(),
                   batch["request_counts"]["completed"].get<int64_t>(), batch["request_counts"]["failed"].get<int64_t>());
}

}  // namespace tessera
