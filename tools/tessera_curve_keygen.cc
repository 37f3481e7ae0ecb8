// tessera-curve-keygen: a CURVE keypair for server.curve (docs/deployment.md): `--out NAME`
// writes NAME.key (the secret key, mode 0600) and NAME.pub (the public key), Z85 text, one
// line each; without --out both are printed. libzmq's own curve_keygen is not packaged.
#include <sys/types.h>

#include <CLI/CLI.hpp>

#include <iostream>
#include <string>
#include <tuple>

#include "common/zmq/curve_keys.h"
#include "common/private_temp_dir.h"

int main(int argc, char** argv) {
  std::string out;
  CLI::App app{"tessera-curve-keygen: make a CURVE keypair for server.curve"};
  app.add_option("--out", out,
                 "write OUT.key (secret, mode 0600) and OUT.pub (public); both must not exist yet (default: print "
                 "both keys on stdout)");
  CLI11_PARSE(app, argc, argv);
  auto keys = tessera::make_curve_keypair();
  if (!keys.is_ok()) {
    std::cerr << "tessera-curve-keygen: " << keys.status().to_string() << std::endl;
    return 1;
  }
  if (out.empty()) {
    std::cout << "public: " << keys->public_key << "\nsecret: " << keys->secret_key << std::endl;
    return 0;
  }
  // New files only (O_EXCL | O_NOFOLLOW): an existing NAME.key, or a symlink planted there,
  // is refused rather than overwritten with a secret it might expose.
  for (const auto& [suffix, text, mode] : {std::tuple<const char*, std::string, mode_t>{".key", keys->secret_key, 0600},
                                           std::tuple<const char*, std::string, mode_t>{".pub", keys->public_key, 0644}}) {
    const tessera::Status st = tessera::write_new_file(out + suffix, text + "\n", mode, "tessera-curve-keygen:");
    if (!st.is_ok()) {
      std::cerr << st.message() << std::endl;
      return 1;
    }
  }
  std::cout << out << ".pub: " << keys->public_key << std::endl;
  return 0;
}
