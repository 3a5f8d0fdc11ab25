#!/usr/bin/env bash
# Installs the Debian 12 packages tessera needs to build, test and train. Run as root.
set -euo pipefail
packages=(
  build-essential cmake pkg-config git python3
  python3-dev python3-venv   # the Python package (python/): headers for the module, a venv to test it
  libopenblas-dev            # BLAS (CBLAS) for GEMM
  libopenmpi-dev openmpi-bin # MPI backend and mpirun
  nlohmann-json3-dev         # JSON: configs, safetensors headers, metrics
  libcli11-dev               # command-line parsing
  libdnnl-dev                # oneDNN 2.6: bf16 GEMMs on CPUs with avx512_bf16/AMX (optional: without it, emulated)
  libisal-dev                # ISA-L: the CRC-32 of checkpoint checksums (zlib's values, 3-4x faster)
  libpcre2-dev               # PCRE2: the pre-tokenizer regexes of Hugging Face tokenizer.json files
  libsentencepiece-dev       # SentencePiece tokenizer.model files (Llama 2, Mistral)
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  fortunes fortunes-min      # the default training corpus
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
