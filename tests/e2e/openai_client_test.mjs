// The official OpenAI Node.js client against a real tessera-serve serving the bundled
// kjv-llama: completions and chat completions, streaming and not, must produce exactly the
// greedy output tessera-generate produces for the same prompt tokens.
// Exit 0 = all passed, 1 = a failure, 77 = skipped (no openai package installed).
import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";

let OpenAI;
try {
  ({ default: OpenAI } = await import("openai"));
} catch {
  console.log("SKIPPED: the openai npm package is not installed (npm ci --prefix tests/e2e)");
  process.exit(77);
}

const bin = process.env.TESSERA_BIN_DIR;
const model = path.join(process.env.TESSERA_SOURCE_DIR, "models", "kjv-llama");
const dir = mkdtempSync(path.join(tmpdir(), "tessera-openai-"));
let passed = 0, failed = 0;
function check(name, ok, detail) {
  if (ok) { passed++; console.log(`ok   ${name}`); }
  else { failed++; console.log(`FAIL ${name}: ${detail}`); }
}

// Reference: tessera-generate on the same prompt ids (greedy).
function generate(promptIds, maxNew) {
  const out = execFileSync(path.join(bin, "tessera-generate"),
    ["--model", model, "--prompt-ids", promptIds.join(","), "--max-new-tokens", String(maxNew), "--json"]);
  return JSON.parse(out.toString());
}
function tokenize(text, special) {
  const args = ["--tokenizer", model, "--text", text, "--json"];
  if (special) args.push("--add-special-tokens");
  return JSON.parse(execFileSync(path.join(bin, "tessera-tokenize"), args).toString()).ids;
}
// tessera-generate's text is decode(output ids) (Llama's decoder strips the first space);
// the API returns the continuation of the prompt, which keeps it.
const same = (api, ref) => api.replace(/^ /, "") === ref;

const server = spawn(path.join(bin, "tessera-serve"),
  ["--port", "0", "--set", `server.control=ipc://${dir}/control.ipc`,
   "--set", `server.zmq_client=ipc://${dir}/client.ipc`], { stdio: ["ignore", "ignore", "pipe"] });
let log = "";
const port = await new Promise((resolve, reject) => {
  const timer = setTimeout(() => reject(new Error("no 'listening on' line in 60 s:\n" + log)), 60000);
  server.stderr.on("data", (d) => {
    log += d.toString();
    const m = log.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
    if (m) { clearTimeout(timer); resolve(Number(m[1])); }
  });
  server.on("exit", (code) => reject(new Error(`tessera-serve exited with ${code}:\n${log}`)));
});

try {
  const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: "unused" });
  const prompt = "And the LORD said unto Moses,";
  const n = 32;
  const ref = generate(tokenize(prompt, true), n);

  const c = await client.completions.create({ model: "kjv-llama", prompt, max_tokens: n, temperature: 0 });
  check("completions", same(c.choices[0].text, ref.text), JSON.stringify([c.choices[0].text, ref.text]));
  check("completions usage", c.usage.completion_tokens === n && c.usage.prompt_tokens === ref.prompt_ids.length,
        JSON.stringify(c.usage));

  let streamed = "";
  const stream = await client.completions.create({ model: "kjv-llama", prompt, max_tokens: n, temperature: 0, stream: true });
  for await (const chunk of stream) streamed += chunk.choices[0]?.text ?? "";
  check("completions stream", same(streamed, ref.text), JSON.stringify([streamed, ref.text]));

  // Chat: the model's chat template renders "<s>" + the message; its tokens (special tokens
  // parsed, none added) are what tessera-generate gets.
  const message = "Blessed are the";
  const chatRef = generate(tokenize("<s>" + message, false), 16);
  const chat = await client.chat.completions.create({
    model: "kjv-llama", messages: [{ role: "user", content: message }], max_tokens: 16, temperature: 0 });
  check("chat", same(chat.choices[0].message.content, chatRef.text),
        JSON.stringify([chat.choices[0].message.content, chatRef.text]));

  let chatStreamed = "";
  const chatStream = await client.chat.completions.create({
    model: "kjv-llama", messages: [{ role: "user", content: message }], max_tokens: 16, temperature: 0, stream: true });
  for await (const chunk of chatStream) chatStreamed += chunk.choices[0]?.delta?.content ?? "";
  check("chat stream", same(chatStreamed, chatRef.text), JSON.stringify([chatStreamed, chatRef.text]));

  try {
    await client.completions.create({ model: "no-such-model", prompt, max_tokens: 4 });
    check("unknown model is 404", false, "no error");
  } catch (e) {
    check("unknown model is 404", e.status === 404, `status ${e.status}`);
  }
} catch (e) {
  check("client run", false, e.stack);
} finally {
  server.kill("SIGTERM");
  await new Promise((r) => server.on("exit", r));
  rmSync(dir, { recursive: true, force: true });
}
console.log(`openai-node: ${passed} passed, ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);
