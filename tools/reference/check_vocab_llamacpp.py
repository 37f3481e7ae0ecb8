# Tessera's GGUF vocabularies against llama.cpp's own vocabulary test files: every
# LLAMA_CPP_DIR/models/ggml-vocab-*.gguf that has its .inp / .out pair (texts split by
# "\n__ggml_vocab_test__\n", the ids Hugging Face's tokenizer gives each, one line per text;
# llama.cpp's tests/test-tokenizer-0 reads the same files) is encoded text by text with
# `tessera-tokenize --tokenizer FILE.gguf` (no special tokens added), and each file's
# matches are printed. A vocabulary Tessera refuses prints its one-line refusal.
# Exit status 1 when any text of a vocabulary Tessera loads differs, except what --expect
# allows (NAME=COUNT: that many differing texts in ggml-vocab-NAME.gguf are known).
# Usage: LLAMA_CPP_DIR=/path/to/llama.cpp python3 tools/reference/check_vocab_llamacpp.py
#            [--build build] [--expect llama-spm=15 ...]
import argparse, json, os, subprocess, sys, tempfile

SEPARATOR = "\n__ggml_vocab_test__\n"


def read_cases(prefix):
    """(text, ids) pairs of one vocabulary's .inp / .out files."""
    with open(prefix + ".inp", "rb") as f:
        raw = f.read().decode("utf-8")
    with open(prefix + ".out", encoding="utf-8") as f:
        outs = f.read().split("\n")
    texts = raw.split(SEPARATOR)
    if texts and texts[-1].endswith(SEPARATOR.rstrip("\n")):
        texts[-1] = texts[-1][: -len(SEPARATOR.rstrip("\n"))]
    return [(text, [int(x) for x in outs[i].split()]) for i, text in enumerate(texts)]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build")
    p.add_argument("--expect", nargs="*", default=[], help="NAME=COUNT: known differing texts")
    a = p.parse_args()
    llama_dir = os.environ.get("LLAMA_CPP_DIR")
    if not llama_dir or not os.path.isdir(llama_dir + "/models"):
        sys.exit("LLAMA_CPP_DIR must name a llama.cpp checkout (its models/ggml-vocab-*.gguf)")
    expected = {k: int(v) for k, v in (e.split("=", 1) for e in a.expect)}
    tool = os.path.abspath(a.build) + "/bin/tessera-tokenize"
    models = llama_dir + "/models/"
    work = tempfile.mkdtemp(prefix="tessera-vocab-check-")
    bad = 0
    for name in sorted(os.listdir(models)):
        if not (name.startswith("ggml-vocab-") and name.endswith(".gguf")):
            continue
        path = models + name
        if not os.path.exists(path + ".inp"):
            continue
        short = name[len("ggml-vocab-"):-len(".gguf")]
        matched, differing, first = 0, 0, None
        refused = None
        for text, want in read_cases(path):
            with open(work + "/text", "wb") as f:
                f.write(text.encode("utf-8"))
            r = subprocess.run([tool, "--tokenizer", path, "--text-file", work + "/text", "--json"],
                               capture_output=True, text=True)
            if r.returncode != 0:
                refused = (r.stderr.strip().splitlines() or ["exit %d" % r.returncode])[-1]
                break
            got = json.loads(r.stdout)["ids"]
            if got == want:
                matched += 1
            else:
                differing += 1
                first = first or (text, want, got)
        if refused:
            print(f"{short}: refused: {refused}")
            continue
        line = f"{short}: {matched} of {matched + differing} texts give llama.cpp's ids"
        if first:
            line += f"; first difference {first[0]!r}: llama.cpp {first[1]}, Tessera {first[2]}"
        print(line)
        bad += differing != expected.get(short, 0)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
