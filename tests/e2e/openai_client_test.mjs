// The official OpenAI Node.js client against a real tessera-serve serving the bundled
// kjv-llama: completions and chat completions, streaming and not, must produce exactly the
// greedy output tessera-generate produces for the same prompt tokens. Then a second server
// whose chat template is a tool-use template (server.chat_template = the fixtures'
// Mistral-Nemo template, whose bos/eos tokens are kjv-llama's and whose tools prompt fits the
// model's 512 positions): a chat request with `tools`, an assistant tool call and a tool result must get
// exactly the prompt that template renders (the fixture's reference rendering, tokenized by
// tessera-tokenize), streaming and not. (Tool calls read out of scripted model output are
// tests/coordinator/tool_calls_http_test.cc: this model writes scripture, not calls.) Between
// them, embeddings (float, base64, the client's default) and the Responses API (plain,
// streamed, retrieved, a forced function call answered through previous_response_id,
// text.format JSON schema validated by ajv, a 400 naming an unknown field).
// Exit 0 = all passed, 1 = a failure, 77 = skipped (no openai package installed).
import { spawn, execFileSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
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

function startServer(name, extra = []) {
  const server = spawn(path.join(bin, "tessera-serve"),
    ["--port", "0", "--set", `server.control=ipc://${dir}/${name}-control.ipc`,
     "--set", `server.zmq_client=ipc://${dir}/${name}-client.ipc`, ...extra], { stdio: ["ignore", "ignore", "pipe"] });
  let log = "";
  const port = new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("no 'listening on' line in 60 s:\n" + log)), 60000);
    server.stderr.on("data", (d) => {
      log += d.toString();
      const m = log.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) { clearTimeout(timer); resolve(Number(m[1])); }
    });
    server.on("exit", (code) => reject(new Error(`tessera-serve exited with ${code}:\n${log}`)));
  });
  return { server, port, log: () => log };
}
async function stopServer(s) {
  if (s.server.exitCode !== null) return;
  s.server.kill("SIGTERM");
  await new Promise((r) => s.server.on("exit", r));
}

const first = startServer("plain");
const port = await first.port;

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
  await stopServer(first);
}

// ---- embeddings and the Responses API ------------------------------------------------------
const third = startServer("api", ["--model", model, "--set", "server.tool_call_parser=hermes"]);
try {
  const apiPort = await third.port;
  const client = new OpenAI({ baseURL: `http://127.0.0.1:${apiPort}/v1`, apiKey: "unused" });
  const input = ["In the beginning God created", "And God said"];
  const norm = (v) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));
  // The client asks for base64 and decodes it when no format is given; "float" is plain JSON.
  const byDefault = await client.embeddings.create({ model: "kjv-llama", input });
  const asFloat = await client.embeddings.create({ model: "kjv-llama", input, encoding_format: "float" });
  const asBase64 = await client.embeddings.create({ model: "kjv-llama", input, encoding_format: "base64" });
  check("embeddings: one normalised vector per input",
        asFloat.data.length === 2 && asFloat.data.every((d, i) => d.index === i && d.embedding.length === 192 &&
                                                            Math.abs(norm(d.embedding) - 1) < 1e-5),
        JSON.stringify(asFloat.data.map((d) => [d.index, d.embedding.length])));
  const floats = (text) => {
    const bytes = Buffer.from(text, "base64");
    return Array.from({ length: bytes.length / 4 }, (_, i) => bytes.readFloatLE(4 * i));
  };
  const decoded = asBase64.data.map((d) => floats(d.embedding));
  const closeTo = (a, b) => a.length === b.length && a.every((x, i) => Math.abs(x - b[i]) < 1e-6);
  check("embeddings: base64 holds the float values", decoded.every((v, i) => closeTo(v, asFloat.data[i].embedding)),
        JSON.stringify([decoded[0]?.slice(0, 3), asFloat.data[0].embedding.slice(0, 3)]));
  check("embeddings: the client's default (base64, decoded) too",
        byDefault.data.every((d, i) => closeTo(Array.from(d.embedding), asFloat.data[i].embedding)), "");
  check("embeddings: usage", asFloat.usage.prompt_tokens === tokenize(input[0], true).length + tokenize(input[1], true).length,
        JSON.stringify(asFloat.usage));

  // Responses: the chat completion of the same conversation, whole and streamed.
  const chat = await client.chat.completions.create({
    model: "kjv-llama", messages: [{ role: "user", content: "And God said" }], max_tokens: 12, temperature: 0 });
  const r = await client.responses.create({ model: "kjv-llama", input: "And God said", max_output_tokens: 12, temperature: 0 });
  check("responses: output_text = the chat answer", r.output_text === chat.choices[0].message.content,
        JSON.stringify([r.output_text, chat.choices[0].message.content]));
  let deltas = "", completed = null;
  for await (const event of await client.responses.create({
    model: "kjv-llama", input: "And God said", max_output_tokens: 12, temperature: 0, stream: true })) {
    if (event.type === "response.output_text.delta") deltas += event.delta;
    if (event.type === "response.completed" || event.type === "response.incomplete") completed = event.response;
  }
  check("responses: streamed deltas and the final response", deltas === r.output_text && completed?.id?.startsWith("resp_"),
        JSON.stringify([deltas, r.output_text, completed?.status]));
  const retrieved = await client.responses.retrieve(r.id);
  check("responses: retrieve", retrieved.id === r.id && retrieved.output_text === r.output_text, JSON.stringify(retrieved));

  // A function tool round trip through previous_response_id.
  const tools = [{ type: "function", name: "get_weather", description: "The weather in a city", strict: false,
                   parameters: { type: "object", properties: { city: { type: "string", maxLength: 12 } }, required: ["city"] } }];
  const called = await client.responses.create({ model: "kjv-llama", input: "Weather in Zion?", tools, tool_choice: "required",
                                                 temperature: 0, max_output_tokens: 200 });
  const call = called.output.find((o) => o.type === "function_call");
  check("responses: a forced function call", call?.name === "get_weather" && typeof JSON.parse(call.arguments).city === "string",
        JSON.stringify(called.output));
  const answered = await client.responses.create({
    model: "kjv-llama", previous_response_id: called.id, tools, temperature: 0, max_output_tokens: 8,
    input: [{ type: "function_call_output", call_id: call?.call_id, output: "Sunny" }] });
  check("responses: the call's output continues the conversation",
        answered.previous_response_id === called.id && answered.usage.input_tokens > called.usage.input_tokens,
        JSON.stringify(answered.usage));

  // text.format JSON schema: the answer is JSON of the schema (checked by ajv).
  const { default: Ajv } = await import("ajv");
  const schema = { type: "object", properties: { book: { type: "string", maxLength: 10 }, chapter: { type: "integer" } },
                   required: ["book", "chapter"], additionalProperties: false };
  const structured = await client.responses.create({ model: "kjv-llama", input: "Name a chapter.", temperature: 0,
    max_output_tokens: 48, text: { format: { type: "json_schema", name: "ref", schema, strict: true } } });
  let parsed = null;
  try { parsed = JSON.parse(structured.output_text); } catch {}
  check("responses: text.format json_schema validates", parsed !== null && new Ajv().validate(schema, parsed),
        structured.output_text);
  try {
    await client.responses.create({ model: "kjv-llama", input: "x", background: true });
    check("responses: an unknown field is 400", false, "no error");
  } catch (e) {
    check("responses: an unknown field is 400", e.status === 400 && /background/.test(e.message), `${e.status} ${e.message}`);
  }
  try {
    await client.embeddings.create({ model: "kjv-llama", input: "x", dimensions: 0 });
    check("embeddings: a bad dimensions is 400", false, "no error");
  } catch (e) {
    check("embeddings: a bad dimensions is 400", e.status === 400 && /dimensions/.test(e.message), `${e.status} ${e.message}`);
  }
} catch (e) {
  check("embeddings and responses run", false, e.stack);
} finally {
  await stopServer(third);
}

// ---- a tool-use chat template --------------------------------------------------------------
const fixtures = process.env.TESSERA_FIXTURES || path.join(process.env.TESSERA_SOURCE_DIR, "..", "shared", "fixtures");
const templates = path.join(fixtures, "chat_templates");
if (!existsSync(path.join(templates, "templates", "mistral-nemo-instruct-2407.json"))) {
  console.log(`SKIPPED tool-use template checks: no chat template fixtures at ${templates}`);
} else {
  const spec = JSON.parse(readFileSync(path.join(templates, "templates", "mistral-nemo-instruct-2407.json"), "utf8"));
  const templateFile = path.join(dir, "mistral-nemo.jinja");
  writeFileSync(templateFile, spec.template);
  const second = startServer("tools", ["--set", `server.chat_template=${templateFile}`]);
  try {
    const toolPort = await second.port;
    check("tool-use template: start-up log names the parser",
          /tool calls read as mistral/.test(second.log()), second.log());
    const client = new OpenAI({ baseURL: `http://127.0.0.1:${toolPort}/v1`, apiKey: "unused" });
    // The fixtures' tools conversation as an OpenAI client sends it: arguments as JSON text.
    const conv = JSON.parse(readFileSync(path.join(templates, "conversations.json"), "utf8")).find((c) => c.id === "f_tools");
    const messages = conv.messages.map((m) => m.tool_calls
      ? { ...m, tool_calls: m.tool_calls.map((tc) => ({ ...tc, function: { ...tc.function, arguments: JSON.stringify(tc.function.arguments) } })) }
      : m);
    const expected = readFileSync(path.join(templates, "expected", "mistral-nemo-instruct-2407__f_tools.txt"), "utf8");
    const expectedIds = tokenize(expected, false);
    const request = { model: "kjv-llama", messages, tools: conv.tools, max_tokens: 8, temperature: 0 };  // 504 prompt tokens + 8 = the 512 positions
    const chat = await client.chat.completions.create(request);
    check("tools: prompt_tokens = the template's rendering", chat.usage.prompt_tokens === expectedIds.length,
          JSON.stringify([chat.usage, expectedIds.length]));
    // The prompt's very tokens: /tokenize renders the same request as chat completions do.
    const tok = await (await fetch(`http://127.0.0.1:${toolPort}/tokenize`, {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ messages, tools: conv.tools }) })).json();
    check("tools: prompt tokens = tessera-tokenize of the rendering",
          JSON.stringify(tok.tokens) === JSON.stringify(expectedIds), JSON.stringify([tok.tokens?.length, expectedIds.length]));
    // This model writes scripture, not calls: the answer is content, generated from that prompt.
    const ref = generate(expectedIds, 8);
    check("tools: greedy continuation of the rendered prompt",
          chat.choices[0].message.content === ref.text || same(chat.choices[0].message.content, ref.text),
          JSON.stringify([chat.choices[0].message.content, ref.text]));
    check("tools: no tool_calls in a plain answer", !chat.choices[0].message.tool_calls?.length,
          JSON.stringify(chat.choices[0].message));
    let streamed = "";
    for await (const chunk of await client.chat.completions.create({ ...request, stream: true }))
      streamed += chunk.choices[0]?.delta?.content ?? "";
    check("tools: stream = non-stream", streamed === chat.choices[0].message.content,
          JSON.stringify([streamed, chat.choices[0].message.content]));
    // tool_choice "required": the reply is decoded under the Mistral call grammar; 8 tokens
    // cut it, so it is "length" with the call's start as content.
    const forced = await client.chat.completions.create({ ...request, tool_choice: "required" });
    const head = '[TOOL_CALLS][{"name": "';
    const forcedText = forced.choices[0].message.content ?? "";
    check("tool_choice required: decoded under the call grammar",
          forced.choices[0].finish_reason === "length" && forcedText.length > 0 &&
            (forcedText.startsWith(head) || head.startsWith(forcedText)),
          JSON.stringify(forced.choices[0]));
    try {
      await client.chat.completions.create({ ...request, tool_choice: { type: "function", function: { name: "no_such_tool" } } });
      check("tool_choice naming an unknown function is 400", false, "no error");
    } catch (e) {
      check("tool_choice naming an unknown function is 400", e.status === 400 && /no_such_tool/.test(e.message),
            `${e.status} ${e.message}`);
    }
  } catch (e) {
    check("tool-use template run", false, e.stack);
  } finally {
    await stopServer(second);
  }
}
rmSync(dir, { recursive: true, force: true });
console.log(`openai-node: ${passed} passed, ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);
