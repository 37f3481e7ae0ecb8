// tessera-curve-keygen: a CURVE keypair for server.curve (docs/deployment.md): `--out NAME`
// writes NAME.key (the secret key, mode 0600) and NAME.pub (the public key), Z85 text, one
// line each; without --out both are printed. libzmq's own curve_keygen is not packaged.
#include <sys/stat.h>

#include <CLI/CLI.hpp>

#include <fstream>
#include <iostream>

#include "common/curve_keys.h"

int main(int argc, char** argv) {
  std::string out;
  CLI::App app{"tessera-curve-keygen: make a CURVE keypair for server.curve"};
  app.add_option("--out", out, "write OUT.key (secret, mode 0600) and OUT.pub (public)");
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
  const mode_t old_mask = umask(077);
  std::ofstream(out + ".key") << keys->secret_key << "\n";
  umask(old_mask);
  std::ofstream(out + ".pub") << keys->public_key << "\n";
  std::ifstream check(out + ".key");
  if (!check) {
    std::cerr << "tessera-curve-keygen: cannot write " << out << ".key" << std::endl;
    return 1;
  }
  std::cout << out << ".pub: " << keys->public_key << std::endl;
  return 0;
}
