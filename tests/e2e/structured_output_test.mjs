// Structured output end to end (issue 19, acceptance 1 and 2): a real tessera-serve, the 50
// schemas of structured_schemas.json (increasing difficulty: scalars, bounds, formats,
// nested objects, arrays of objects, enums, anyOf, $ref recursion, patterns), 20 seeded
// samples each at temperature 1 (one request with n = 20: choice c draws with seed + c), and
// every completed output ("finish_reason": "stop") parsed and validated by ajv — a JSON
// Schema validator this project does not write. Twice: with a random-weight model (the
// worst case, it has no idea what JSON is: tiny-bloom's weights with kjv-llama's tokenizer)
// and with kjv-llama. Then guided_regex, guided_choice and json_object outputs, greedy
// output identical alone and batched with unconstrained requests, and streaming.
// Exit 0 = all passed, 1 = a failure, 77 = skipped (no ajv installed, or no fixtures).
import { spawn } from "node:child_process";
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

let Ajv2020, addFormats;
try {
  ({ default: Ajv2020 } = await import("ajv/dist/2020.js"));
  ({ default: addFormats } = await import("ajv-formats"));
} catch {
  console.log("SKIPPED: the ajv npm packages are not installed (npm ci --prefix tests/e2e)");
  process.exit(77);
}

const here = path.dirname(fileURLToPath(import.meta.url));
const bin = process.env.TESSERA_BIN_DIR;
const fixtures = process.env.TESSERA_FIXTURES || path.join(process.env.TESSERA_SOURCE_DIR, "..", "shared", "fixtures");
if (!existsSync(path.join(fixtures, "tiny-bloom", "model.safetensors")) || !existsSync(path.join(fixtures, "kjv-llama"))) {
  console.log(`SKIPPED: no fixtures at ${fixtures}`);
  process.exit(77);
}
// Fewer samples where asked (sanitizer builds run several times slower).
const samples = Number(process.env.TESSERA_STRUCTURED_SAMPLES || 20);
const schemas = JSON.parse(readFileSync(path.join(here, "structured_schemas.json"), "utf8"));
const dir = mkdtempSync(path.join(tmpdir(), "tessera-structured-"));
let passed = 0, failed = 0;
function check(name, ok, detail) {
  if (ok) { passed++; console.log(`ok   ${name}`); }
  else { failed++; console.log(`FAIL ${name}: ${detail}`); }
}

// The random-weight model: tiny-bloom (vocabulary 1024) with kjv-llama's 1024-token tokenizer.
const randomModel = path.join(dir, "random-bloom");
mkdirSync(randomModel);
for (const f of ["config.json", "model.safetensors"]) copyFileSync(path.join(fixtures, "tiny-bloom", f), path.join(randomModel, f));
for (const f of ["tokenizer.json", "tokenizer_config.json"]) copyFileSync(path.join(fixtures, "kjv-llama", f), path.join(randomModel, f));

function startServer(name, model) {
  const server = spawn(path.join(bin, "tessera-serve"),
    ["--model", model, "--port", "0", "--set", `server.control=ipc://${dir}/${name}-control.ipc`,
     "--set", `server.zmq_client=ipc://${dir}/${name}-client.ipc`], { stdio: ["ignore", "ignore", "pipe"] });
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
async function post(port, body, route = "/v1/completions") {
  const r = await fetch(`http://127.0.0.1:${port}${route}`, {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
  const text = await r.text();
  return { status: r.status, text, json: (() => { try { return JSON.parse(text); } catch { return null; } })() };
}

// strict (unknown keywords and formats are errors), without the lints of schema style
// (strictTypes: a keyword beside allOf without its "type"; strictTuples: prefixItems without maxItems).
const ajv = new Ajv2020({ strict: true, strictTypes: false, strictTuples: false, allowUnionTypes: true, allErrors: true });
addFormats(ajv);

async function runModel(label, model, prompt) {
  const s = startServer(label, model);
  try {
    const port = await s.port;
    // Acceptance 1: every completed sample of every schema validates.
    let completed = 0, truncated = 0, invalid = 0;
    const started = Date.now();
    for (let i = 0; i < schemas.length; i++) {
      const validate = ajv.compile(schemas[i]);
      const r = await post(port, { prompt, max_tokens: 256, temperature: 1, seed: 1000 + i, n: samples, guided_json: schemas[i] });
      if (r.status !== 200) { check(`${label} schema ${i} request`, false, r.text); continue; }
      for (const c of r.json.choices) {
        if (c.finish_reason === "length") { truncated++; continue; }
        if (c.finish_reason !== "stop") { invalid++; check(`${label} schema ${i} finish_reason`, false, JSON.stringify(c)); continue; }
        completed++;
        let doc;
        try { doc = JSON.parse(c.text); } catch (e) {
          invalid++; check(`${label} schema ${i} parses`, false, `${JSON.stringify(c.text)}: ${e.message}`); continue;
        }
        if (!validate(doc)) {
          invalid++;
          check(`${label} schema ${i} validates`, false, `${c.text}\n${JSON.stringify(validate.errors)}`);
        }
      }
    }
    check(`${label}: ${completed} completed samples of ${schemas.length} schemas × ${samples} all parse and validate ` +
          `(${truncated} cut by max_tokens; ${((Date.now() - started) / 1000).toFixed(1)} s)`, invalid === 0, `${invalid} invalid`);
    check(`${label}: most samples complete`, completed >= (schemas.length * samples) / 2, `${completed} completed, ${truncated} truncated`);

    // Acceptance 2: guided_regex, guided_choice, json_object.
    const regex = "[a-z]{2,5}-\\d{1,3}( ok)?";
    const re = new RegExp(`^(?:${regex})$`);
    const rr = await post(port, { prompt, max_tokens: 32, temperature: 1, seed: 7, n: samples, guided_regex: regex });
    const rBad = rr.json.choices.filter((c) => c.finish_reason !== "stop" || !re.test(c.text));
    check(`${label}: guided_regex outputs all match`, rr.status === 200 && rBad.length === 0, JSON.stringify(rBad.slice(0, 3)));
    const choices = ["alpha", "beta", "gamma delta"];
    const rc = await post(port, { prompt, max_tokens: 16, temperature: 1, seed: 8, n: samples, guided_choice: choices });
    const cBad = rc.json.choices.filter((c) => c.finish_reason !== "stop" || !choices.includes(c.text));
    check(`${label}: guided_choice outputs are choices`, rc.status === 200 && cBad.length === 0, JSON.stringify(cBad.slice(0, 3)));
    const ro = await post(port, { prompt, max_tokens: 256, temperature: 1, seed: 9, n: samples, response_format: { type: "json_object" } });
    let objects = 0;
    const oBad = ro.json.choices.filter((c) => {
      if (c.finish_reason !== "stop") return false;
      try { const d = JSON.parse(c.text); objects++; return typeof d !== "object" || d === null || Array.isArray(d); } catch { return true; }
    });
    check(`${label}: json_object outputs parse as objects (${objects} completed)`, ro.status === 200 && oBad.length === 0,
          JSON.stringify(oBad.slice(0, 3)));

    // Greedy: identical alone and batched with unconstrained requests.
    const schema = schemas[44];
    const greedy = { prompt, max_tokens: 200, temperature: 0, guided_json: schema };
    const alone = await post(port, greedy);
    const [batched, ...others] = await Promise.all([
      post(port, greedy),
      post(port, { prompt: "And it came to pass", max_tokens: 64, temperature: 1, seed: 3, n: 3 }),
      post(port, { prompt, max_tokens: 48, temperature: 0 }),
      post(port, { prompt: "In the beginning", max_tokens: 80, temperature: 0.7, seed: 4 }),
    ]);
    check(`${label}: greedy constrained output identical alone and batched`,
          alone.status === 200 && batched.status === 200 && alone.json.choices[0].text === batched.json.choices[0].text &&
          others.every((o) => o.status === 200),
          JSON.stringify([alone.json?.choices?.[0]?.text, batched.json?.choices?.[0]?.text]));
    if (alone.json?.choices?.[0]?.finish_reason === "stop") {
      check(`${label}: greedy output validates`, ajv.compile(schema)(JSON.parse(alone.json.choices[0].text)), alone.json.choices[0].text);
    }

    // Streaming: the same seeded sample, streamed, is the same text.
    const one = { prompt, max_tokens: 128, temperature: 1, seed: 11, guided_json: schemas[31] };
    const plain = await post(port, one);
    const streamed = await post(port, { ...one, stream: true });
    let text = "", finish = null;
    for (const line of streamed.text.split("\n")) {
      if (!line.startsWith("data: {")) continue;
      const ev = JSON.parse(line.slice(6));
      text += ev.choices[0]?.text ?? "";
      finish = ev.choices[0]?.finish_reason ?? finish;
    }
    check(`${label}: streamed constrained output equals the non-streamed one`,
          text === plain.json.choices[0].text && finish === plain.json.choices[0].finish_reason,
          JSON.stringify([text, plain.json.choices[0].text, finish]));

    // max_tokens cuts a document: finish_reason "length" and (documented) invalid JSON.
    const cut = await post(port, { prompt, max_tokens: 3, temperature: 0, guided_json: schemas[43] });
    check(`${label}: a document cut by max_tokens ends with "length"`, cut.json?.choices?.[0]?.finish_reason === "length", cut.text);
  } catch (e) {
    check(`${label} run`, false, e.stack + "\n" + s.log());
  } finally {
    await stopServer(s);
  }
}

await runModel("random-weight", randomModel, "Output:");
await runModel("kjv-llama", path.join(fixtures, "kjv-llama"), "And the LORD said unto Moses, Write this in JSON:");
rmSync(dir, { recursive: true, force: true });
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);
