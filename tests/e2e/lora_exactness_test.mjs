// LoRA exactness against merged weights (issue 39, acceptance 1): a random PEFT adapter on
// every linear layer of a fixture model must give the logits of the base with
// W + scale · B · A merged into its checkpoint. The merge below is an independent
// transcription of PEFT's merge_and_unload (plain JavaScript over the safetensors bytes,
// sharing no code with Tessera); the merged model is then an ordinary checkpoint that
// tessera-generate runs without any adapter. Compared: greedy ids equal and every logit
// within the fixtures' fp32 tolerance, with the adapter applied at tensor-parallel 1 and 2 and
// on the plain (non-fused) path. The adapter must also move the logits, or the comparison
// would hold with the adapter ignored.
//
//   node lora_exactness_test.mjs FIXTURE [TARGETS] [--rslora]
// Environment: TESSERA_BIN_DIR (tessera-generate, tessera-make-checkpoint), TESSERA_FIXTURES.
// Exit 77 (a visible skip) without the fixtures.
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

const TOLERANCE = 1e-3;  // ../shared/fixtures/README.md: logits <= 1e-3 in fp32
const NEW_TOKENS = 8;

const [fixture, targets = 'all-linear', ...flags] = process.argv.slice(2);
const binDir = process.env.TESSERA_BIN_DIR;
const fixtures = process.env.TESSERA_FIXTURES;
if (!fixture || !binDir) {
  console.error('usage: TESSERA_BIN_DIR=... TESSERA_FIXTURES=... node lora_exactness_test.mjs FIXTURE [TARGETS] [--rslora]');
  process.exit(2);
}
const base = path.join(fixtures ?? '', fixture);
if (!fixtures || !fs.existsSync(path.join(base, 'goldens', 'index.json'))) {
  console.log(`SKIPPED: fixture ${fixture} not found (TESSERA_FIXTURES=${fixtures ?? ''})`);
  process.exit(77);
}

// ---- safetensors, read and written directly ----------------------------------------------

function readSafetensors(file) {
  const buf = fs.readFileSync(file);
  const headerLen = Number(buf.readBigUInt64LE(0));
  const header = JSON.parse(buf.subarray(8, 8 + headerLen).toString('utf8'));
  const dataStart = 8 + headerLen;
  const tensors = new Map();
  for (const [name, info] of Object.entries(header)) {
    if (name === '__metadata__') continue;
    const [begin, end] = info.data_offsets;
    tensors.set(name, { dtype: info.dtype, shape: info.shape, bytes: buf.subarray(dataStart + begin, dataStart + end) });
  }
  return tensors;
}

function f32(t) {
  if (t.dtype !== 'F32') throw new Error(`expected F32, got ${t.dtype}`);
  const copy = Buffer.from(t.bytes);  // aligned for Float32Array
  return new Float32Array(copy.buffer, copy.byteOffset, copy.length / 4);
}

function writeSafetensors(file, tensors) {
  const header = {};
  let offset = 0;
  const parts = [];
  for (const [name, t] of tensors) {
    header[name] = { dtype: t.dtype, shape: t.shape, data_offsets: [offset, offset + t.bytes.length] };
    offset += t.bytes.length;
    parts.push(t.bytes);
  }
  let json = Buffer.from(JSON.stringify(header), 'utf8');
  const pad = (8 - (json.length % 8)) % 8;
  json = Buffer.concat([json, Buffer.from(' '.repeat(pad))]);
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(json.length));
  fs.writeFileSync(file, Buffer.concat([len, json, ...parts]));
}

// ---- PEFT's merge: W += scale · (B · A), transposed for fan_in_fan_out layers ---------------

function mergeAdapter(baseDir, adapterDir, outDir) {
  const config = JSON.parse(fs.readFileSync(path.join(adapterDir, 'adapter_config.json'), 'utf8'));
  const r = config.r;
  const scale = config.use_rslora ? config.lora_alpha / Math.sqrt(r) : config.lora_alpha / r;
  const weights = readSafetensors(path.join(baseDir, 'model.safetensors'));
  const factors = readSafetensors(path.join(adapterDir, 'adapter_model.safetensors'));
  let merged = 0;
  for (const [name, a] of factors) {
    const m = /^base_model\.model\.(.*)\.lora_A(?:\.[^.]+)?\.weight$/.exec(name);
    if (!m) continue;
    const module = m[1];
    const bName = name.replace('.lora_A', '.lora_B');
    const b = factors.get(bName);
    const w = weights.get(`${module}.weight`);
    if (!b || !w) throw new Error(`${name}: no ${bName} or no base weight ${module}.weight`);
    const [rank, inputs] = a.shape;
    const [outputs] = b.shape;
    const A = f32(a), B = f32(b), W = f32(w);
    if (W.length !== outputs * inputs) throw new Error(`${module}: base ${w.shape} against B ${b.shape} and A ${a.shape}`);
    for (let o = 0; o < outputs; ++o) {
      for (let i = 0; i < inputs; ++i) {
        let delta = 0;
        for (let k = 0; k < rank; ++k) delta += B[o * rank + k] * A[k * inputs + i];
        // fan_in_fan_out: the base stores [in, out] (GPT-2's Conv1D), the delta goes in transposed.
        const at = config.fan_in_fan_out ? i * outputs + o : o * inputs + i;
        W[at] = Math.fround(W[at] + Math.fround(scale * delta));
      }
    }
    w.bytes = Buffer.from(W.buffer);
    ++merged;
  }
  if (merged === 0) throw new Error(`${adapterDir}: no lora_A tensors`);
  fs.mkdirSync(outDir, { recursive: true });
  for (const f of fs.readdirSync(baseDir)) {
    if (f.endsWith('.json')) fs.copyFileSync(path.join(baseDir, f), path.join(outDir, f));
  }
  writeSafetensors(path.join(outDir, 'model.safetensors'), weights);
  return merged;
}

// ---- runs ---------------------------------------------------------------------------------

const work = fs.mkdtempSync(path.join(os.tmpdir(), `tessera-lora-${fixture}-`));
process.on('exit', () => fs.rmSync(work, { recursive: true, force: true }));

const cases = JSON.parse(fs.readFileSync(path.join(base, 'goldens', 'index.json'), 'utf8')).cases;
const promptFile = path.join(work, 'prompts.txt');
fs.writeFileSync(promptFile, cases.map((c) => c.prompt_ids.join(',')).join('\n') + '\n');

function generate(model, extra, tag) {
  const logitsFile = path.join(work, `${tag}.f32`);
  const out = execFileSync(path.join(binDir, 'tessera-generate'),
    ['--model', model, '--prompt-ids-file', promptFile, '--max-new-tokens', String(NEW_TOKENS), '--json',
      '--dump-logits', logitsFile, '--threads', '1', ...extra],
    { encoding: 'utf8', env: { ...process.env, OMP_WAIT_POLICY: 'passive' } });
  const ids = out.trim().split('\n').map((line) => JSON.parse(line).output_ids);
  const raw = fs.readFileSync(logitsFile);
  return { ids, logits: new Float32Array(raw.buffer, raw.byteOffset, raw.length / 4) };
}

function maxDiff(x, y) {
  if (x.length !== y.length) throw new Error(`logit counts differ: ${x.length} vs ${y.length}`);
  let d = 0;
  for (let i = 0; i < x.length; ++i) d = Math.max(d, Math.abs(x[i] - y[i]));
  return d;
}

const adapterDir = path.join(work, 'adapter');
execFileSync(path.join(binDir, 'tessera-make-checkpoint'),
  ['--lora-of', base, '--out', adapterDir, '--lora-rank', '8', '--lora-alpha', '16', '--lora-targets', targets, '--seed', '7',
    ...(flags.includes('--rslora') ? ['--lora-rslora'] : [])], { stdio: ['ignore', 'ignore', 'inherit'] });
const mergedDir = path.join(work, 'merged');
const modules = mergeAdapter(base, adapterDir, mergedDir);

const reference = generate(mergedDir, [], 'merged');
const plain = generate(base, [], 'base');
let failed = false;
const moved = maxDiff(reference.logits, plain.logits);
console.log(`${fixture} (${targets}): ${modules} adapted modules; the adapter moves the logits by up to ${moved.toExponential(2)}`);
if (!(moved > 10 * TOLERANCE)) {
  console.log('FAIL: the merged adapter hardly changes the logits, so the comparison would not notice it ignored');
  failed = true;
}
for (const [tag, extra] of [['tp1', []], ['tp2', ['--tensor-parallel', '2']], ['tp1-plain', ['--no-kernel-inject']],
  ['tp2-plain', ['--tensor-parallel', '2', '--no-kernel-inject']]]) {
  const got = generate(base, ['--lora', `a=${adapterDir}`, '--prompt-lora', 'a', ...extra], tag);
  const diff = maxDiff(got.logits, reference.logits);
  const sameIds = JSON.stringify(got.ids) === JSON.stringify(reference.ids);
  console.log(`  ${tag}: ids ${sameIds ? 'equal' : 'DIFFER'}, max |logit - merged| ${diff.toExponential(2)}`);
  if (!sameIds || !(diff <= TOLERANCE)) {
    if (!sameIds) console.log(`    got ${JSON.stringify(got.ids)}\n    merged ${JSON.stringify(reference.ids)}`);
    failed = true;
  }
}
process.exit(failed ? 1 : 0);
