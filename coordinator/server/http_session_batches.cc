// The Batch API's routes (/v1/files, /v1/batches): the method and key checks, then
// BatchStore (coordinator/api/batch_store.h) answers. Uploads, batch creation and file
// contents touch the disk, so they run off the I/O threads.
#include "coordinator/server/http_session.h"

#include <string>

namespace tessera {

namespace beast = boost::beast;
namespace http = beast::http;

void HttpSession::handle_batch_api(const Request& req, const std::string& path, const char* allowed) {
  const std::string method = head_ ? "GET" : std::string(req.method_string());
  const std::string methods = std::string(", ") + allowed + ",";
  if (methods.find(", " + method + ",") == std::string::npos) {
    return send_error(api_error(405, "invalid_request_error", "method_not_allowed",
                                "method " + std::string(req.method_string()) + " is not allowed on " + path),
                      {{"Allow", allowed}});
  }
  if (!authorized(req)) {
    return send_error(api_error(401, "invalid_request_error", "invalid_api_key",
                                "missing or invalid API key (send 'Authorization: Bearer <key>')"),
                      {{"WWW-Authenticate", "Bearer"}});
  }
  BatchStore* store = server_.batches.get();
  if (store == nullptr) {
    return send_error(api_error(404, "invalid_request_error", "batch_api_off",
                                "the Batch API is off on this server: it needs server.batch_dir (docs/configuration.md)"));
  }
  const auto answer = [this](ApiReply r) { send(r.status, r.content_type, std::move(r.body)); };
  const bool files = path.rfind("/v1/files", 0) == 0;
  const std::string rest = path.substr(files ? 9 : 11);  // "", "/{id}" or "/{id}/content|cancel"
  const size_t second = rest.find('/', 1);
  const std::string id = rest.empty() ? "" : rest.substr(1, second == std::string::npos ? std::string::npos : second - 1);
  const bool sub = second != std::string::npos;  // .../content or .../cancel
  if (files) {
    if (id.empty() && method == "POST") {
      std::string content_type(req[http::field::content_type]);
      return off_io(
          req.body().size(),
          [store, content_type = std::move(content_type), body = req.body()]() { return store->upload_file(content_type, body); },
          answer);
    }
    if (id.empty()) return answer(store->list_files());
    if (sub) return off_io(0, [store, id]() { return store->file_content(id); }, answer);
    if (method == "DELETE") return answer(store->delete_file(id));
    return answer(store->get_file(id));
  }
  if (id.empty() && method == "POST")
    return off_io(req.body().size(), [store, body = req.body()]() { return store->create_batch(body); }, answer);
  if (id.empty()) return answer(store->list_batches());
  if (sub) return answer(store->cancel_batch(id));
  return answer(store->get_batch(id));
}

}  // namespace tessera
