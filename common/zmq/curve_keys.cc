#include "common/zmq/curve_keys.h"

#include <zmq.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/input_file.h"

namespace tessera {
namespace {

constexpr char kZ85[] =
    "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";

std::string trim(const std::string& s) {
  const char* ws = " \t\r\n";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

Status check_key(const std::string& key, const std::string& where) {
  if (is_z85_key(key)) return Status::ok();
  return invalid_argument(where + ": expected a CURVE key (40 Z85 characters, as tessera-curve-keygen writes), got " +
                          std::to_string(key.size()) + " characters");
}

StatusOr<std::string> read_text(const std::string& path, const std::string& what) {
  if (path.empty()) return invalid_argument(what + ": no file given");
  StatusOr<std::string> text = read_input_file(path, what, 1 << 20);
  if (text.status().code() == StatusCode::kNotFound)
    return not_found(what + ": cannot read '" + path + "' (is the Secret mounted?)");
  return text;
}

}  // namespace

bool is_z85_key(const std::string& key) {
  return key.size() == 40 && std::all_of(key.begin(), key.end(), [](char c) { return c != '\0' && std::strchr(kZ85, c); });
}

StatusOr<CurveKeypair> make_curve_keypair() {
  if (!zmq_has("curve")) return unimplemented("this libzmq was built without CURVE");
  char pub[41] = {}, sec[41] = {};
  if (zmq_curve_keypair(pub, sec) != 0) return internal_error("zmq_curve_keypair failed");
  return CurveKeypair{pub, sec};
}

StatusOr<std::string> curve_public_key_of(const std::string& secret_key) {
  if (!zmq_has("curve")) return unimplemented("this libzmq was built without CURVE");
  TESSERA_RETURN_IF_ERROR(check_key(secret_key, "secret key"));
  char pub[41] = {};
  if (zmq_curve_public(pub, secret_key.c_str()) != 0) return internal_error("zmq_curve_public failed");
  return std::string(pub);
}

StatusOr<std::string> read_curve_key_file(const std::string& path, const std::string& what) {
  TESSERA_ASSIGN_OR_RETURN(std::string text, read_text(path, what));
  const std::string key = trim(text);
  TESSERA_RETURN_IF_ERROR(check_key(key, what + " (" + path + ")"));
  return key;
}

StatusOr<std::vector<std::string>> read_curve_key_list(const std::string& path, const std::string& what) {
  TESSERA_ASSIGN_OR_RETURN(std::string text, read_text(path, what));
  std::vector<std::string> keys;
  std::istringstream lines(text);
  int n = 0;
  for (std::string line; std::getline(lines, line);) {
    ++n;
    line = trim(line);
    // '#' is a Z85 character too: a line of exactly one key is a key, else '#' starts a comment.
    if (line.empty() || (!is_z85_key(line) && line[0] == '#')) continue;
    TESSERA_RETURN_IF_ERROR(check_key(line, what + " (" + path + ":" + std::to_string(n) + ")"));
    keys.push_back(line);
  }
  if (keys.empty()) {
    return invalid_argument(what + " (" + path + "): no keys listed; every worker would be refused "
                            "(set the key to \"\" to let in any worker holding the server key)");
  }
  return keys;
}

StatusOr<CurveServerKeys> load_curve_server_keys(const CurveSection& c) {
  CurveServerKeys out;
  if (!c.enabled) return out;
  if (c.server_secret_key_file.empty()) {
    return invalid_argument("server.curve.server_secret_key_file: required on the coordinator when "
                            "server.curve.enabled is true");
  }
  TESSERA_ASSIGN_OR_RETURN(out.server.secret_key,
                           read_curve_key_file(c.server_secret_key_file, "server.curve.server_secret_key_file"));
  TESSERA_ASSIGN_OR_RETURN(out.server.public_key, curve_public_key_of(out.server.secret_key));
  if (!c.server_public_key_file.empty()) {
    TESSERA_ASSIGN_OR_RETURN(std::string listed,
                             read_curve_key_file(c.server_public_key_file, "server.curve.server_public_key_file"));
    if (listed != out.server.public_key) {
      return invalid_argument("server.curve.server_public_key_file (" + c.server_public_key_file + ") holds " +
                              listed + ", but the secret key in " + c.server_secret_key_file + " belongs to " +
                              out.server.public_key + ": the two files are not one keypair");
    }
  }
  if (!c.allowed_client_keys_file.empty()) {
    TESSERA_ASSIGN_OR_RETURN(out.allowed_client_keys,
                             read_curve_key_list(c.allowed_client_keys_file, "server.curve.allowed_client_keys_file"));
  }
  return out;
}

StatusOr<CurveClientKeys> load_curve_client_keys(const CurveSection& c) {
  CurveClientKeys out;
  if (!c.enabled) return out;
  if (c.server_public_key_file.empty()) {
    return invalid_argument("server.curve.server_public_key_file: required on a worker when server.curve.enabled "
                            "is true (the coordinator's public key)");
  }
  TESSERA_ASSIGN_OR_RETURN(out.server_public_key,
                           read_curve_key_file(c.server_public_key_file, "server.curve.server_public_key_file"));
  if (c.client_secret_key_file.empty()) {
    TESSERA_ASSIGN_OR_RETURN(out.client, make_curve_keypair());
  } else {
    TESSERA_ASSIGN_OR_RETURN(out.client.secret_key,
                             read_curve_key_file(c.client_secret_key_file, "server.curve.client_secret_key_file"));
    TESSERA_ASSIGN_OR_RETURN(out.client.public_key, curve_public_key_of(out.client.secret_key));
  }
  return out;
}

}  // namespace tessera
