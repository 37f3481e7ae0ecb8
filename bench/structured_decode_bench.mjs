// Constrained vs unconstrained decode throughput on a real tessera-serve (docs/structured-output.md,
// "Cost"): one request of n = 16 seeded choices (temperature $TEMPERATURE, default 1), max_tokens tokens each,
// unconstrained (ignore_eos) and constrained by a JSON schema that cannot complete within
// max_tokens (an array of at least 200 objects), so both run every choice to the length
// limit and differ only by the masks. Rounds alternate; medians of completion tok/s are printed
// as one JSON object.
//
// usage: node bench/structured_decode_bench.mjs BIN_DIR MODEL_DIR [ROUNDS] [MAX_TOKENS] [EXTRA serve args...]
// MODEL_DIR needs a tokenizer.json, e.g. the generated ~100M Llama
//   (tessera-make-checkpoint --arch llama --preset 100m --out DIR) with
//   ../shared/fixtures/tokenizers/llama2-spm/tokenizer*.json copied in (both have 32,000 ids).
import { spawn } from "node:child_process";
import { mkdtempSync, readFileSync, readdirSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";

const [bin, model, roundsArg, maxArg, ...extra] = process.argv.slice(2);
if (!bin || !model) {
  console.error("usage: node bench/structured_decode_bench.mjs BIN_DIR MODEL_DIR [ROUNDS] [MAX_TOKENS] [serve args...]");
  process.exit(2);
}
const rounds = Number(roundsArg || 3), maxTokens = Number(maxArg || 64);
// TEMPERATURE=0: greedy, where the sampler's own cost is an argmax either way, so the
// difference is the masks alone (at temperature 1 the unconstrained sampler sorts the whole
// vocabulary, the constrained one only the allowed ids).
const temperature = Number(process.env.TEMPERATURE ?? 1);
const dir = mkdtempSync(path.join(tmpdir(), "tessera-structured-bench-"));
const server = spawn(path.join(bin, "tessera-serve"),
  ["--model", model, "--port", "0", "--set", `server.control=ipc://${dir}/control.ipc`,
   "--set", `server.zmq_client=ipc://${dir}/client.ipc`, ...extra], { stdio: ["ignore", "ignore", "pipe"] });
let log = "";
const port = await new Promise((resolve, reject) => {
  server.stderr.on("data", (d) => {
    log += d.toString();
    const m = log.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
    if (m) resolve(Number(m[1]));
  });
  server.on("exit", (code) => reject(new Error(`tessera-serve exited with ${code}:\n${log}`)));
});

const schema = { type: "array", minItems: 200, items: { type: "object",
  properties: { name: { type: "string", maxLength: 12 }, n: { type: "integer" }, ok: { type: "boolean" } },
  required: ["name", "n", "ok"], additionalProperties: false } };
// CPU seconds (user + system) used so far by the server's process (the coordinator: HTTP,
// engine loop, mask threads) and by its children (the workers), from /proc (Linux; null
// elsewhere). On a shared machine wall-clock tok/s moves with the neighbours, while the CPU
// the masks add to the coordinator per round does not.
const ticksPerS = 100;  // USER_HZ
function cpuSeconds(pid) {
  try {
    const f = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1].split(" ");
    return (Number(f[11]) + Number(f[12])) / ticksPerS;
  } catch { return null; }
}
function childPids(pid) {
  const out = [];
  for (const d of readdirSync("/proc")) {
    if (!/^\d+$/.test(d)) continue;
    try { if (readFileSync(`/proc/${d}/stat`, "utf8").split(") ")[1].split(" ")[1] === String(pid)) out.push(Number(d)); } catch {}
  }
  return out;
}
function cpuNow() {
  const coordinator = cpuSeconds(server.pid);
  const workers = childPids(server.pid).reduce((sum, p) => sum + (cpuSeconds(p) ?? 0), 0);
  return { coordinator, workers };
}

async function round(constrained, seed) {
  const body = { prompt: "The list of records:", max_tokens: maxTokens, temperature, seed, n: 16, ignore_eos: true };
  if (constrained) body.guided_json = schema;
  const t0 = performance.now(), startedAt = Date.now(), cpu0 = cpuNow();
  const r = await fetch(`http://127.0.0.1:${port}/v1/completions`, {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
  const j = await r.json();
  const s = (performance.now() - t0) / 1000, cpu1 = cpuNow();
  if (!r.ok) throw new Error(JSON.stringify(j));
  const lengths = j.choices.filter((c) => c.finish_reason === "length").length;
  return { tok_s: j.usage.completion_tokens / s, tokens: j.usage.completion_tokens, all_length: lengths === 16,
           at: [startedAt, Date.now()], coordinator_cpu_s: cpu1.coordinator - cpu0.coordinator,
           workers_cpu_s: cpu1.workers - cpu0.workers };
}
const median = (v) => [...v].sort((a, b) => a - b)[Math.floor(v.length / 2)];
try {
  await round(false, 1);  // warm-up: both paths, and the schema's caches
  await round(true, 1);
  const u = [], c = [], at = [], cpu = { unconstrained: [], constrained: [] };
  let allLength = true;
  for (let i = 0; i < rounds; i++) {
    const a = await round(false, 10 + i), b = await round(true, 10 + i);
    u.push(a.tok_s); c.push(b.tok_s);
    cpu.unconstrained.push([a.coordinator_cpu_s, a.workers_cpu_s]);
    cpu.constrained.push([b.coordinator_cpu_s, b.workers_cpu_s]);
    at.push([a.at[0], b.at[1]]);  // wall-clock span of the pair (ms since the epoch), to match with the machine's load
    allLength = allLength && a.all_length && b.all_length;
  }
  console.log(JSON.stringify({ model, batch: 16, max_tokens: maxTokens, rounds, temperature,
    unconstrained_tok_s: median(u), constrained_tok_s: median(c), ratio: median(c) / median(u),
    every_choice_ran_to_length: allLength, unconstrained_all: u, constrained_all: c, pair_at_ms: at,
    // per round: [coordinator CPU s, workers' CPU s]
    cpu_s: cpu }));
} finally {
  server.kill("SIGTERM");
}
