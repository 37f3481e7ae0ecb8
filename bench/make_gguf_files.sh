#!/usr/bin/env bash
# Makes the GGUF files bench/compare_llamacpp_4bit.sh compares on, with llama.cpp's own tools:
# the generated ~1.1B Llama (bench/make_models.sh 1b-bf16) converted by convert_hf_to_gguf.py
# to BF16, then llama-quantize to Q4_0, Q4_K_M and Q5_K_M. Each file only when missing.
#   LLAMA_CPP_DIR=DIR bench/make_gguf_files.sh HF_DIR OUT_DIR
# Writes OUT_DIR/llama-1b-{BF16,Q4_0,Q4_K_M,Q5_K_M}.gguf.
#
# The generated checkpoint has random weights and no tokenizer, and the converter needs one:
# a SentencePiece model of the checkpoint's vocabulary size is trained on random words (the
# tokens mean nothing; the benchmarks feed token ids). The converter runs under Debian's
# Python with python3-torch, python3-numpy, python3-sentencepiece and python3-tqdm (apt);
# transformers is not packaged there, and the converter imports it only for AutoConfig, whose
# failure it answers by reading config.json, so a stub module that fails is put on PYTHONPATH;
# Debian's PyTorch 1.13 lacks the float8 dtypes the converter lists in a table, so they are
# given placeholder values (no tensor of this checkpoint is float8).
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "$0")/lib.sh"
(($# == 2)) || die "usage: LLAMA_CPP_DIR=DIR $0 HF_DIR OUT_DIR"
hf=$1; out=$2
[[ -n ${LLAMA_CPP_DIR:-} ]] || die "LLAMA_CPP_DIR is not set (a llama.cpp checkout built by hand, with build/bin/llama-quantize)"
need_bin "$LLAMA_CPP_DIR/build/bin" "LLAMA_CPP_DIR must hold a built llama.cpp" llama-quantize
need_model "$hf"
py=/usr/bin/python3
"$py" -c "import torch, numpy, sentencepiece, tqdm" 2>/dev/null ||
  die "$py lacks torch, numpy, sentencepiece or tqdm (apt-get install python3-torch python3-numpy python3-sentencepiece python3-tqdm)"
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

bf16=$out/llama-1b-BF16.gguf
if [[ ! -f $bf16 ]]; then
  vocab=$("$py" -c "import json, sys; print(json.load(open(sys.argv[1]))['vocab_size'])" "$hf/config.json")
  "$py" - "$work" "$vocab" <<'PY'
import random, sys
import sentencepiece as spm
work, vocab = sys.argv[1], int(sys.argv[2])
random.seed(0)
words = ["".join(random.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(random.randint(3, 9))) for _ in range(60000)]
with open(f"{work}/corpus.txt", "w") as f:
    for _ in range(200000):
        f.write(" ".join(random.choice(words) for _ in range(12)) + "\n")
spm.SentencePieceTrainer.train(input=f"{work}/corpus.txt", model_prefix=f"{work}/tokenizer", vocab_size=vocab,
                               model_type="bpe", byte_fallback=True, character_coverage=1.0, num_threads=2,
                               minloglevel=2)
PY
  mkdir -p "$work/hf" "$work/shim/transformers"
  for f in "$hf"/*; do ln -s "$(realpath "$f")" "$work/hf/"; done
  cp "$work/tokenizer.model" "$work/hf/tokenizer.model"
  cat >"$work/shim/transformers/__init__.py" <<'PY'
class AutoConfig:
    @staticmethod
    def from_pretrained(*args, **kwargs):
        raise RuntimeError("transformers is not installed: config.json is read instead")
PY
  cat >"$work/shim/sitecustomize.py" <<'PY'
import torch
for name in ("float8_e4m3fn", "float8_e5m2"):
    if not hasattr(torch, name):
        setattr(torch, name, object())
PY
  PYTHONPATH=$work/shim "$py" "$LLAMA_CPP_DIR/convert_hf_to_gguf.py" "$work/hf" --outtype bf16 --outfile "$bf16" \
    >"$work/convert.log" 2>&1 || { tail -20 "$work/convert.log" >&2; die "convert_hf_to_gguf.py failed"; }
  echo "$bf16: made"
else
  echo "$bf16: present"
fi
for type in Q4_0 Q4_K_M Q5_K_M; do
  f=$out/llama-1b-$type.gguf
  if [[ -f $f ]]; then echo "$f: present"; continue; fi
  "$LLAMA_CPP_DIR/build/bin/llama-quantize" "$bf16" "$f" "$type" 2 >"$work/quantize.log" 2>&1 ||
    { tail -20 "$work/quantize.log" >&2; die "llama-quantize $type failed"; }
  echo "$f: made"
done
