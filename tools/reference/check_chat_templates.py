# Tessera's chat-template rendering against Python Jinja2 set up as transformers'
# apply_chat_template sets it up (sandboxed, trim_blocks and lstrip_blocks, loop controls, the
# {% generation %} tag, its tojson, raise_exception, strftime_now), on any templates: each
# TEMPLATE (a .jinja file, or a folder of them: llama.cpp's models/templates holds ~65 real
# ones) with each conversation of the chat-template corpus (content parts joined with no
# separator, as Tessera's API joins them). Tessera renders through `tessera-tokenize
# --chat-file --chat-template`, the server's own path; bos_token and eos_token are the
# --tokenizer folder's. Per template: how many conversations render the same, how many both
# refuse, and each difference (the first differing line, or which one refuses).
# Exit status 1 when any differ, except as many as --expect-differences allows.
# Needs jinja2 (Debian: python3-jinja2).
# Usage: python3 tools/reference/check_chat_templates.py [--build build] [--tokenizer DIR]
#            [--conversations FILE] [--expect-differences N] TEMPLATE...
import argparse, datetime, json, os, subprocess, sys, tempfile

from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

FIXTURES = os.environ.get("TESSERA_FIXTURES", os.path.join(os.path.dirname(__file__), "../../../shared/fixtures"))


class GenerationTag(Extension):
    """transformers' {% generation %}: renders its body (the assistant-mask bookkeeping left out)."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_body", []), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def make_environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, loopcontrols])

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def raise_exception(message):
        raise RuntimeError(message)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env


def joined(messages):
    """Content parts joined with no separator, as Tessera's API passes them to the template."""
    out = []
    for m in messages:
        if isinstance(m.get("content"), list):
            m = dict(m, content="".join(p.get("text", "") for p in m["content"] if p.get("type") == "text"))
        out.append(m)
    return out


def python_render(env, source, chat, bos, eos):
    context = dict(messages=chat["messages"], tools=chat.get("tools"), documents=None, add_generation_prompt=True)
    if bos is not None:
        context["bos_token"] = bos
    if eos is not None:
        context["eos_token"] = eos
    try:
        return env.from_string(source).render(**context), None
    except Exception as e:  # the template raising, or a type error: a refusal
        return None, f"{type(e).__name__}: {e}".split("\n")[0]


def tessera_render(tool, tokenizer, template_path, chat, work):
    with open(work + "/chat.json", "w", encoding="utf-8") as f:
        json.dump(dict(chat, add_generation_prompt=True), f, ensure_ascii=False)
    r = subprocess.run([tool, "--tokenizer", tokenizer, "--chat-file", work + "/chat.json", "--chat-template",
                        template_path], capture_output=True, text=True)
    if r.returncode != 0:
        return None, (r.stderr.strip().splitlines() or ["exit %d" % r.returncode])[-1]
    return json.loads(r.stdout)["prompt"], None


def first_difference(a, b):
    la, lb = a.split("\n"), b.split("\n")
    k = next((i for i in range(min(len(la), len(lb))) if la[i] != lb[i]), min(len(la), len(lb)))
    return f"line {k + 1}: Jinja2 {la[k] if k < len(la) else '<end>'!r}, Tessera {lb[k] if k < len(lb) else '<end>'!r}"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("templates", nargs="+")
    p.add_argument("--build", default="build")
    p.add_argument("--tokenizer", default=os.path.join(FIXTURES, "kjv-llama"))
    p.add_argument("--conversations", default=os.path.join(FIXTURES, "chat_templates/conversations.json"))
    p.add_argument("--expect-differences", type=int, default=0)
    a = p.parse_args()
    files = []
    for t in a.templates:
        files += sorted(os.path.join(t, f) for f in os.listdir(t) if f.endswith(".jinja")) if os.path.isdir(t) else [t]
    with open(a.conversations, encoding="utf-8") as f:
        conversations = json.load(f)
    config_path = os.path.join(a.tokenizer, "tokenizer_config.json")
    config = json.load(open(config_path, encoding="utf-8")) if os.path.exists(config_path) else {}
    special = lambda v: v.get("content") if isinstance(v, dict) else v
    bos, eos = special(config.get("bos_token")), special(config.get("eos_token"))
    tool = os.path.abspath(a.build) + "/bin/tessera-tokenize"
    env = make_environment()
    work = tempfile.mkdtemp(prefix="tessera-template-check-")
    same = refused = differ = 0
    for path in files:
        with open(path, encoding="utf-8") as f:
            source = f.read()
        notes = []
        for conv in conversations:
            chat = {"messages": joined(conv["messages"])}
            if conv.get("tools") is not None:
                chat["tools"] = conv["tools"]
            want, want_err = python_render(env, source, chat, bos, eos)
            got, got_err = tessera_render(tool, a.tokenizer, path, chat, work)
            if want is not None and got == want:
                same += 1
            elif want is None and got is None:
                refused += 1
            else:
                differ += 1
                if want is None:
                    notes.append(f"{conv['id']}: Jinja2 refuses ({want_err}), Tessera renders")
                elif got is None:
                    notes.append(f"{conv['id']}: Tessera refuses ({got_err}), Jinja2 renders")
                else:
                    notes.append(f"{conv['id']}: {first_difference(want, got)}")
        name = os.path.basename(path)
        print(f"{name}: " + ("same" if not notes else "; ".join(notes)))
    total = same + refused + differ
    print(f"{total} renderings: {same} the same, {refused} refused by both, {differ} different")
    sys.exit(1 if differ > a.expect_differences else 0)


if __name__ == "__main__":
    main()
