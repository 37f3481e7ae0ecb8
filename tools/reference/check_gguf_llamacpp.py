# Tessera against llama.cpp on GGUF files llama.cpp's own tools make: each Hugging Face folder
# is converted by LLAMA_CPP_DIR's convert_hf_to_gguf.py (f32), requantized by its
# llama-quantize to each type, and every file runs greedy through tessera-generate
# (--dump-logits) and teacher-forced on the same ids through llama.cpp (llamacpp_logits.cc,
# built here against LLAMA_CPP_DIR). Printed per file: the largest logit difference over three
# prompts (5, 17 and 60 random ids, 12 generated), how many of llama.cpp's argmaxes equal
# Tessera's ids, and the flips on a clear margin (ids that differ where llama.cpp's top-1/top-2
# margin exceeds twice that row's difference). Exit status 1 on any such flip or failure.
#
# With --lora-rank R each folder also gets a random PEFT LoRA adapter of rank R on every linear
# layer (tessera-make-checkpoint --lora-of), converted by llama.cpp's convert_lora_to_gguf.py,
# and every file runs again with it in both engines (Tessera --lora, llama.cpp
# llama_set_adapters_lora at scale 1); those lines end in "+ lora".
#
# The folders need no tokenizer (the file gets llama.cpp's "no_vocab" model: ids only).
# Needs numpy and torch (Debian's python3-torch will do) for the converters.
# Usage: LLAMA_CPP_DIR=/path/to/llama.cpp /usr/bin/python3 tools/reference/check_gguf_llamacpp.py
#            [--build build] [--types F32,Q8_0,Q4_K_M] [--out DIR] [--quantize-flags '...']
#            [--tensor-parallel N] [--lora-rank R] FOLDER...
import argparse, json, os, random, runpy, subprocess, sys, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TYPES = "F32,F16,BF16,Q8_0,Q4_0,Q4_1,Q5_0,Q5_1,Q4_K_S,Q4_K_M,Q5_K_S,Q5_K_M,Q6_K"


# safetensors.torch.load_file for convert_lora_to_gguf.py where the package is not installed
# (Debian has none): the header's JSON, then each tensor's bytes as a torch tensor.
SAFETENSORS_SHIM = """import json, struct, torch
DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
def load_file(path, device="cpu"):
    data = bytearray(open(path, "rb").read())
    n = struct.unpack("<Q", bytes(data[:8]))[0]
    out = {}
    for name, t in json.loads(bytes(data[8:8 + n])).items():
        if name == "__metadata__":
            continue
        begin, end = t["data_offsets"]
        dtype = DTYPES[t["dtype"]]
        count = (end - begin) // torch.tensor([], dtype=dtype).element_size()
        out[name] = torch.frombuffer(data, dtype=dtype, count=count, offset=8 + n + begin).reshape(t["shape"]).clone()
    return out
"""


def install_shims(llama_dir):
    """What llama.cpp's converters import and this machine may lack, and its gguf-py."""
    shim = tempfile.mkdtemp(prefix="tessera-gguf-shim-")
    os.makedirs(shim + "/transformers")
    # The converter falls back to config.json when AutoConfig fails; no tokenizer is read.
    with open(shim + "/transformers/__init__.py", "w") as f:
        f.write("class AutoConfig:\n    @staticmethod\n    def from_pretrained(*a, **k):\n"
                "        raise RuntimeError('no transformers here')\nclass AutoTokenizer(AutoConfig):\n    pass\n")
    try:
        import safetensors.torch  # noqa: F401
    except ImportError:
        os.makedirs(shim + "/safetensors")
        open(shim + "/safetensors/__init__.py", "w").close()
        with open(shim + "/safetensors/torch.py", "w") as f:
            f.write(SAFETENSORS_SHIM)
    sys.path[:0] = [shim, llama_dir, llama_dir + "/gguf-py"]
    import torch
    for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "uint16", "uint32", "uint64"):
        if not hasattr(torch, name):  # older torch (Debian's 1.13) lacks them; never used here
            setattr(torch, name, type(name, (), {})())


def convert_lora(llama_dir, adapter, base, out):
    """convert_lora_to_gguf.py on the PEFT folder `adapter` of the model folder `base`."""
    install_shims(llama_dir)
    sys.argv = ["convert_lora_to_gguf.py", "--base", base, "--outtype", "f32", "--outfile", out, adapter]
    runpy.run_path(llama_dir + "/convert_lora_to_gguf.py", run_name="__main__")


def convert(llama_dir, folder, out):
    """convert_hf_to_gguf.py on `folder`, in this process, without a vocabulary."""
    install_shims(llama_dir)
    import importlib, pkgutil
    import conversion
    import conversion.base as base
    for module in pkgutil.iter_modules(conversion.__path__):
        try:
            importlib.import_module("conversion." + module.name)
        except Exception:
            pass  # a family whose module needs what is not installed: not checked here

    def no_vocab(self):
        self.gguf_writer.add_tokenizer_model("no_vocab")
        hp = self.hparams
        self.gguf_writer.add_vocab_size(hp.get("vocab_size") or hp["text_config"]["vocab_size"])

    def subclasses(c):
        for s in c.__subclasses__():
            yield s
            yield from subclasses(s)
    for c in [base.TextModel] + list(subclasses(base.TextModel)):
        if "set_vocab" in c.__dict__:
            c.set_vocab = no_vocab
    # Gemma 3's converter counts the vocabulary in tokenizer.json to trim the table: a folder
    # without one is staged (links) beside a tokenizer.json of vocab_size plain entries.
    if not os.path.exists(folder + "/tokenizer.json"):
        staged = tempfile.mkdtemp(prefix="tessera-gguf-folder-")
        for entry in os.listdir(folder):
            os.symlink(os.path.abspath(folder + "/" + entry), staged + "/" + entry)
        vocab = json.load(open(folder + "/config.json")).get("vocab_size")
        if vocab:
            with open(staged + "/tokenizer.json", "w") as f:
                json.dump({"model": {"vocab": {"t%d" % i: i for i in range(vocab)}}, "added_tokens": []}, f)
        folder = staged
    import convert_hf_to_gguf
    sys.argv = ["convert_hf_to_gguf.py", folder, "--outtype", "f32", "--outfile", out]
    convert_hf_to_gguf.main()


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True)


def compare(gguf, vocab, bin_dir, logits_tool, work, tp, adapter=None):
    """(largest difference, equal argmaxes, rows, clear-margin flips) over three prompts, or an error line."""
    import numpy as np
    worst, equal, rows, flips, moved = 0.0, 0, 0, 0, 0.0
    lora = ["--lora", "a=" + adapter, "--prompt-lora", "a"] if adapter else []
    for n in (5, 17, 60):
        rng = random.Random(n)
        prompt = [rng.randrange(3, vocab) for _ in range(n)]
        g = run([bin_dir + "/tessera-generate", "--model", gguf, "--prompt-ids", ",".join(map(str, prompt)),
                 "--max-new-tokens", "12", "--dump-logits", work + "/t.f32", "--json", "--tensor-parallel", str(tp)]
                + lora)
        if g.returncode != 0:
            return "tessera-generate: " + g.stderr.strip().splitlines()[-1]
        ids = json.loads(g.stdout.strip().splitlines()[-1])["output_ids"]
        t = np.fromfile(work + "/t.f32", dtype=np.float32).reshape(-1, vocab)
        ll = run([logits_tool, gguf, "512", ",".join(map(str, prompt + ids[:-1])), work + "/l.f32"]
                 + ([adapter] if adapter else []))
        if ll.returncode != 0:
            return "llama.cpp: " + (ll.stderr.strip().splitlines() or ["exit %d" % ll.returncode])[-1]
        l = np.fromfile(work + "/l.f32", dtype=np.float32).reshape(-1, vocab)[n - 1:]
        if adapter:  # how far the adapter moves llama.cpp's logits: an adapter that did nothing checks nothing
            ll = run([logits_tool, gguf, "512", ",".join(map(str, prompt + ids[:-1])), work + "/b.f32"])
            if ll.returncode != 0:
                return "llama.cpp: " + (ll.stderr.strip().splitlines() or ["exit %d" % ll.returncode])[-1]
            base = np.fromfile(work + "/b.f32", dtype=np.float32).reshape(-1, vocab)[n - 1:]
            moved = max(moved, float(np.abs(l - base).max()))
        diff = np.abs(l - t).max(axis=1)
        top2 = np.sort(l, axis=1)[:, -2:]
        argmax = l.argmax(axis=1)
        worst = max(worst, float(diff.max()))
        equal += int((argmax == np.array(ids)).sum())
        rows += len(ids)
        flips += int(((argmax != np.array(ids)) & (top2[:, 1] - top2[:, 0] > 2 * diff)).sum())
    if adapter and moved < 1e-3:
        return f"the adapter moves llama.cpp's logits by {moved:.3g} only"
    return worst, equal, rows, flips, moved


class Failure(str):
    pass


def make_adapter(folder, work, rank, bin_dir, llama_dir):
    """A random rank-`rank` PEFT adapter of `folder` on every linear layer, as llama.cpp's GGUF."""
    made = run([bin_dir + "/tessera-make-checkpoint", "--lora-of", folder, "--lora-rank", str(rank),
                "--lora-targets", "all-linear", "--out", work])
    if made.returncode != 0:
        return Failure("tessera-make-checkpoint --lora-of: " + made.stderr.strip().splitlines()[-1])
    gguf = work + ".gguf"
    c = run([sys.executable, os.path.abspath(__file__), "--convert-lora", work, folder, gguf])
    if c.returncode != 0:
        return Failure("convert_lora_to_gguf.py: " + (c.stderr.strip().splitlines() or ["failed"])[-1])
    return gguf


def main():
    p = argparse.ArgumentParser()
    p.add_argument("folders", nargs="*")
    p.add_argument("--build", default="build")
    p.add_argument("--types", default=TYPES)
    p.add_argument("--out", default=None)
    p.add_argument("--quantize-flags", default="", help="extra llama-quantize flags, e.g. '--pure'")
    p.add_argument("--tensor-parallel", type=int, default=1, help="Tessera's worker processes")
    p.add_argument("--lora-rank", type=int, default=0, help="also check a random LoRA adapter of this rank")
    p.add_argument("--convert", nargs=2, metavar=("FOLDER", "OUT"), help=argparse.SUPPRESS)
    p.add_argument("--convert-lora", nargs=3, metavar=("ADAPTER", "BASE", "OUT"), help=argparse.SUPPRESS)
    a = p.parse_args()
    llama_dir = os.environ.get("LLAMA_CPP_DIR")
    if not llama_dir or not os.path.isfile(llama_dir + "/build/bin/llama-quantize"):
        sys.exit("LLAMA_CPP_DIR must name a llama.cpp checkout built in build/ (llama-quantize, libllama)")
    if a.convert:
        return convert(llama_dir, *a.convert)
    if a.convert_lora:
        return convert_lora(llama_dir, *a.convert_lora)
    out = a.out or tempfile.mkdtemp(prefix="tessera-gguf-check-")
    os.makedirs(out, exist_ok=True)
    lib = llama_dir + "/build/bin"
    tool = out + "/llamacpp_logits"
    built = run(["g++", "-O2", "-std=c++17", "-I" + llama_dir + "/include", "-I" + llama_dir + "/ggml/include",
                 HERE + "/llamacpp_logits.cc", "-L" + lib, "-lllama", "-lggml", "-lggml-base", "-Wl,-rpath," + lib,
                 "-o", tool])
    if built.returncode != 0:
        sys.exit("building llamacpp_logits failed:\n" + built.stderr)
    commit = run(["git", "-C", llama_dir, "rev-parse", "--short=12", "HEAD"]).stdout.strip()
    print(f"llama.cpp {commit or '(unknown commit)'}; Tessera at tensor-parallel {a.tensor_parallel}; files under {out}")
    bin_dir = os.path.abspath(a.build) + "/bin"
    bad = 0
    for folder in a.folders:
        name = os.path.basename(os.path.normpath(folder))
        vocab = json.load(open(folder + "/config.json"))["vocab_size"]
        f32 = f"{out}/{name}-F32.gguf"
        c = run([sys.executable, os.path.abspath(__file__), "--convert", folder, f32])
        if c.returncode != 0:
            print(f"{name}: the converter failed: {c.stderr.strip().splitlines()[-1]}")
            continue  # llama.cpp cannot make the file: nothing to compare
        adapter = make_adapter(folder, f"{out}/{name}-lora", a.lora_rank, bin_dir, llama_dir) if a.lora_rank else None
        if isinstance(adapter, Failure):
            bad += 1
            print(f"{name}: FAILED {adapter}")
            adapter = None
        for t in a.types.split(","):
            path = f32 if t == "F32" else f"{out}/{name}-{t}.gguf"
            if t != "F32":
                q = run([lib + "/llama-quantize"] + a.quantize_flags.split() + [f32, path, t])
                if q.returncode != 0:
                    print(f"{name} {t}: llama-quantize refused: {q.stderr.strip().splitlines()[-1]}")
                    continue
            for lora in [None] + ([adapter] if adapter else []):
                label = f"{name} {t}" + (" + lora" if lora else "")
                r = compare(path, vocab, bin_dir, tool, out, a.tensor_parallel, lora)
                if isinstance(r, str):
                    bad += 1
                    print(f"{label}: FAILED {r}")
                    continue
                worst, equal, rows, flips, moved = r
                bad += flips > 0
                print(f"{label}: max |logit diff| {worst:.3g}, argmax equal {equal}/{rows}, clear-margin flips {flips}"
                      + (f" (the adapter moves llama.cpp's logits up to {moved:.3g})" if lora else ""))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
