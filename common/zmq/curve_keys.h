#pragma once
// CURVE keys for the ZeroMQ links (server.curve in the configuration): Z85 text, 40
// characters, read from files (a mounted Kubernetes Secret), and the keys derived from them.
#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"

namespace tessera {

struct CurveKeypair {
  std::string public_key;  // Z85, 40 characters
  std::string secret_key;
};

// True for 40 characters of ZeroMQ's Z85 alphabet.
bool is_z85_key(const std::string& key);
// A fresh keypair (zmq_curve_keypair). Unimplemented when libzmq lacks CURVE.
StatusOr<CurveKeypair> make_curve_keypair();
// The public key of a secret key (zmq_curve_public).
StatusOr<std::string> curve_public_key_of(const std::string& secret_key);
// One key from a file (surrounding whitespace ignored); errors name `what` (the config key)
// and the file.
StatusOr<std::string> read_curve_key_file(const std::string& path, const std::string& what);
// Public keys, one per line; blank lines and lines starting with `#` that are not a key
// (`#` is a Z85 character) are ignored. An empty list is an
// error (it would refuse every worker).
StatusOr<std::vector<std::string>> read_curve_key_list(const std::string& path, const std::string& what);

// What a coordinator needs from server.curve (empty keys when CURVE is off): its keypair
// (the secret key file's, checked against the public key file when both are given) and the
// allowed worker keys.
struct CurveServerKeys {
  CurveKeypair server;
  std::vector<std::string> allowed_client_keys;  // empty = any client holding the server key
};
StatusOr<CurveServerKeys> load_curve_server_keys(const CurveSection& curve);

// What a worker needs: the server's public key and its own keypair (from
// client_secret_key_file, or fresh when that is "").
struct CurveClientKeys {
  std::string server_public_key;
  CurveKeypair client;
};
StatusOr<CurveClientKeys> load_curve_client_keys(const CurveSection& curve);

}  // namespace tessera
