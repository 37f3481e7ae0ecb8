// Renders every Kubernetes overlay (k8s/overlays/*, k8s/lws, k8s/gateway) with `kubectl kustomize` and
// checks the objects: each against the Kubernetes API's OpenAPI schemas (the npm package
// kubernetes-models, plus a strict pass that rejects fields the schema does not know), then
// against Tessera's own configuration in the ConfigMap: selectors match labels, every port the
// config names is exposed, the worker count equals parallel.tensor_parallel, probes point at
// real endpoints, images and resources are set. No cluster and no network needed.
// Exit 0 = passed, 1 = a failure, 77 = skipped (no kubectl, or `npm ci` not run here).
import { execFileSync } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const source = process.env.TESSERA_SOURCE_DIR || path.resolve(here, "../..");
let YAML;
try {
  YAML = await import("yaml");
  await import("kubernetes-models/apps/v1/Deployment");
} catch {
  console.log("SKIPPED: npm packages missing (run `npm ci` in tests/k8s; scripts/install_deps.sh does)");
  process.exit(77);
}
const kubectl = process.env.KUBECTL || "kubectl";
try {
  execFileSync(kubectl, ["version", "--client"], { stdio: "ignore" });
} catch {
  console.log(`SKIPPED: ${kubectl} not found (Debian: apt-get install kubernetes-client)`);
  process.exit(77);
}

let passed = 0, failed = 0;
function check(name, ok, detail = "") {
  if (ok) passed++;
  else { failed++; console.log(`FAIL ${name}${detail ? ": " + detail : ""}`); }
  return ok;
}

// ---- schema validation -------------------------------------------------------------------

const schemaCache = new Map();
async function schemaFor(apiVersion, kind) {
  const [group, version] = apiVersion.includes("/") ? apiVersion.split("/") : ["core", apiVersion];
  const cap = (s) => s.charAt(0).toUpperCase() + s.slice(1);
  const name = `IoK8sApi${cap(group.split(".")[0])}${cap(version)}${kind}`;
  if (!schemaCache.has(name)) {
    const file = path.join(here, "node_modules/kubernetes-models/_schemas", name + ".mjs");
    schemaCache.set(name, existsSync(file) ? (await import(new URL("file://" + file))).validate : null);
  }
  return schemaCache.get(name);
}

// The compiled validators read every property their schema knows (and enumerate the keys of
// free-form maps such as labels): a key never read is a field the API does not have.
function strictValidate(validateFn, obj) {
  const records = new Map();
  const wrap = (o, at) => {
    if (o === null || typeof o !== "object") return o;
    let rec = records.get(o);
    if (!rec) records.set(o, (rec = { read: new Set(), iterated: false, at }));
    return new Proxy(o, {
      get(t, k, r) {
        const v = Reflect.get(t, k, r);
        if (typeof k !== "string") return v;
        rec.read.add(k);
        return wrap(v, `${at}/${k}`);
      },
      has(t, k) { if (typeof k === "string") rec.read.add(k); return Reflect.has(t, k); },
      ownKeys(t) { rec.iterated = true; return Reflect.ownKeys(t); },
    });
  };
  const errors = [];
  if (!validateFn(wrap(obj, ""))) {
    for (const e of validateFn.errors) errors.push(`${e.instancePath || "/"}: ${e.keyword} ${JSON.stringify(e.params)}`);
  }
  for (const [o, rec] of records) {
    if (Array.isArray(o) || rec.iterated) continue;
    for (const k of Object.keys(o)) if (!rec.read.has(k)) errors.push(`${rec.at}/${k}: unknown field`);
  }
  return errors;
}

// ---- helpers -------------------------------------------------------------------------------

const subset = (sel, labels) => Object.entries(sel || {}).every(([k, v]) => labels && labels[k] === v);
function tcpPort(endpoint) {
  const m = /^tcp:\/\/(.+):(\d+)$/.exec(endpoint || "");
  return m ? { host: m[1], port: Number(m[2]) } : null;
}
function podTemplates(objs) {
  const out = [];
  for (const o of objs) {
    if (o.kind === "Deployment" || o.kind === "StatefulSet") out.push({ owner: o, role: o.kind, template: o.spec.template });
    if (o.kind === "LeaderWorkerSet") {
      out.push({ owner: o, role: "leader", template: o.spec.leaderWorkerTemplate.leaderTemplate });
      out.push({ owner: o, role: "worker", template: o.spec.leaderWorkerTemplate.workerTemplate });
    }
  }
  return out;
}
const containerPort = (c, ref) =>
  typeof ref === "number" ? ref : ((c.ports || []).find((p) => p.name === ref) || {}).containerPort;
const isCoordinator = (c) => (c.args || c.command || [])[0] === "tessera-coordinator";
const isWorker = (c) => (c.args || c.command || [])[0] === "tessera-worker";
const quantity = (q) => q !== undefined && q !== null && String(q) !== "";

// ---- one rendering -----------------------------------------------------------------------

async function checkRendering(target) {
  const dir = path.join(source, "k8s", target);
  let text;
  try {
    text = execFileSync(kubectl, ["kustomize", dir], { stdio: ["ignore", "pipe", "pipe"] }).toString();
  } catch (e) {
    check(`${target}: kubectl kustomize`, false, String(e.stderr || e));
    return;
  }
  const objs = YAML.parseAllDocuments(text).map((d) => d.toJS()).filter(Boolean);
  const T = (name) => `${target}: ${name}`;
  check(T("renders objects"), objs.length >= 3, `${objs.length} objects`);

  // 1. Every object against the API schema (LWS is a custom resource: its pod templates).
  for (const o of objs) {
    const id = `${o.kind}/${o.metadata && o.metadata.name}`;
    if (o.kind === "LeaderWorkerSet") {
      check(T(`${id} apiVersion`), o.apiVersion === "leaderworkerset.x-k8s.io/v1", o.apiVersion);
      const lwt = o.spec.leaderWorkerTemplate;
      check(T(`${id} size`), Number.isInteger(lwt.size) && lwt.size >= 1, String(lwt.size));
      const tmpl = await schemaFor("v1", "PodTemplateSpec");
      for (const key of ["leaderTemplate", "workerTemplate"]) {
        const errs = strictValidate(tmpl, lwt[key]);
        check(T(`${id} ${key} is a valid PodTemplateSpec`), errs.length === 0, errs.join("; "));
      }
      continue;
    }
    if (o.kind === "InferencePool" || o.kind === "HTTPRoute") {
      // Custom resources kubernetes-models has no schema for: their API version and the
      // fields of the published API (inference.networking.k8s.io/v1, gateway.networking.k8s.io/v1).
      const known = o.kind === "InferencePool"
        ? { apiVersion: "inference.networking.k8s.io/v1", spec: ["selector", "targetPorts", "appProtocol", "endpointPickerRef"] }
        : { apiVersion: "gateway.networking.k8s.io/v1", spec: ["parentRefs", "hostnames", "rules"] };
      check(T(`${id} apiVersion`), o.apiVersion === known.apiVersion, o.apiVersion);
      const unknown = Object.keys(o.spec || {}).filter((k) => !known.spec.includes(k));
      check(T(`${id} spec has only known fields`), unknown.length === 0, unknown.join(", "));
      continue;
    }
    const validate = await schemaFor(o.apiVersion, o.kind);
    if (!check(T(`${id} has a schema`), validate !== null, o.apiVersion)) continue;
    const errs = strictValidate(validate, o);
    check(T(`${id} is valid`), errs.length === 0, errs.join("; "));
  }

  // 2. Tessera's configuration.
  const cms = objs.filter((o) => o.kind === "ConfigMap" && o.data && o.data["tessera.yaml"]);
  if (!check(T("one ConfigMap holds tessera.yaml"), cms.length === 1, `${cms.length}`)) return;
  const cm = cms[0];
  const cfg = YAML.parse(cm.data["tessera.yaml"]);
  const server = cfg.server || {}, worker = cfg.worker || {};
  const tp = (cfg.parallel || {}).tensor_parallel || 1;
  const httpPort = (server.http || {}).port ?? 8000;
  const zmq = tcpPort(server.zmq_client ?? "tcp://127.0.0.1:5555");
  const control = tcpPort(server.control ?? "tcp://127.0.0.1:5560");
  const backend = worker.backend || "auto";
  check(T("server.http.host is reachable from other pods"), (server.http || {}).host === "0.0.0.0", (server.http || {}).host);
  check(T("server.control binds a fixed tcp port on every interface"), control && control.host === "0.0.0.0", server.control);
  if (server.zmq_client !== "") check(T("server.zmq_client binds on every interface"), zmq && zmq.host === "0.0.0.0", server.zmq_client);

  const templates = podTemplates(objs);
  const services = objs.filter((o) => o.kind === "Service");
  const coordinators = [], workers = [];
  for (const t of templates) {
    for (const c of t.template.spec.containers) {
      if (isCoordinator(c)) coordinators.push({ ...t, c });
      if (isWorker(c)) workers.push({ ...t, c });
    }
  }
  if (!check(T("one coordinator container"), coordinators.length === 1, `${coordinators.length}`)) return;
  check(T("worker containers"), workers.length >= 1);
  const coord = coordinators[0];

  // Selectors match labels: controllers' own templates, Services and PDBs a pod template.
  for (const o of objs.filter((x) => x.kind === "Deployment" || x.kind === "StatefulSet")) {
    check(T(`${o.kind}/${o.metadata.name} selector matches its template's labels`),
          subset(o.spec.selector.matchLabels, o.spec.template.metadata.labels),
          JSON.stringify(o.spec.selector.matchLabels));
  }
  const podLabels = (t) => {
    const l = { ...(t.template.metadata || {}).labels };
    if (t.owner.kind === "LeaderWorkerSet") l["leaderworkerset.sigs.k8s.io/name"] = t.owner.metadata.name;
    return l;
  };
  const selected = (sel) => templates.filter((t) => subset(sel, podLabels(t)));
  for (const s of services) {
    const sel = selected(s.spec.selector);
    check(T(`Service/${s.metadata.name} selects pods`), sel.length >= 1, JSON.stringify(s.spec.selector));
    for (const p of s.spec.ports || []) {
      const target = p.targetPort ?? p.port;
      const ok = sel.some((t) => t.template.spec.containers.some((c) => containerPort(c, target) !== undefined));
      check(T(`Service/${s.metadata.name} port ${p.name} targets a container port`), ok, String(target));
    }
  }
  for (const pdb of objs.filter((o) => o.kind === "PodDisruptionBudget")) {
    check(T(`PodDisruptionBudget/${pdb.metadata.name} selects pods`), selected(pdb.spec.selector.matchLabels).length >= 1);
  }

  // Every port the config names is exposed: container ports, and Services to reach them.
  const exposes = (port, pred) => services.some((s) => (s.spec.ports || []).some((p) =>
    selected(s.spec.selector).some((t) => t.template.spec.containers.includes(coord.c)) &&
    containerPort(coord.c, p.targetPort ?? p.port) === port && pred(s, p)));
  check(T(`coordinator container port ${httpPort} (server.http.port)`), containerPort(coord.c, "http") === httpPort);
  check(T(`a Service exposes server.http.port ${httpPort}`), exposes(httpPort, () => true));
  if (zmq) {
    check(T(`coordinator container port ${zmq.port} (server.zmq_client)`), (coord.c.ports || []).some((p) => p.containerPort === zmq.port));
    check(T(`a Service exposes server.zmq_client port ${zmq.port}`), exposes(zmq.port, () => true));
  }
  check(T(`coordinator container port ${control.port} (server.control)`), (coord.c.ports || []).some((p) => p.containerPort === control.port));

  // Workers reach the coordinator: worker.control_address names a Service (published while the
  // coordinator is not ready) whose port leads to server.control; or, with LWS, the leader.
  const isLws = templates.some((t) => t.owner.kind === "LeaderWorkerSet");
  if (isLws) {
    check(T("worker.control_address is empty (LWS_LEADER_ADDRESS names the leader)"), !worker.control_address);
    check(T("the coordinator runs in the leader pod"), coord.role === "leader");
  } else {
    const addr = tcpPort(worker.control_address);
    if (check(T("worker.control_address is tcp://SERVICE:PORT"), addr !== null, worker.control_address)) {
      const svc = services.find((s) => s.metadata.name === addr.host);
      const ok = svc && (svc.spec.ports || []).some((p) => p.port === addr.port &&
        containerPort(coord.c, p.targetPort ?? p.port) === control.port);
      check(T(`Service ${addr.host}:${addr.port} leads to server.control`), !!ok);
      check(T(`Service ${addr.host} publishes not-ready addresses`), svc && svc.spec.publishNotReadyAddresses === true);
    }
  }

  // The worker count equals tensor_parallel.
  const sts = objs.filter((o) => o.kind === "StatefulSet");
  const lws = objs.filter((o) => o.kind === "LeaderWorkerSet");
  if (isLws) {
    check(T(`LeaderWorkerSet size = tensor_parallel (${tp})`), lws[0].spec.leaderWorkerTemplate.size === tp,
          String(lws[0].spec.leaderWorkerTemplate.size));
  } else {
    check(T("one worker StatefulSet"), sts.length === 1);
    const w = sts[0];
    check(T(`StatefulSet replicas = tensor_parallel (${tp})`), w.spec.replicas === tp, String(w.spec.replicas));
    const headless = services.find((s) => s.metadata.name === w.spec.serviceName);
    check(T("StatefulSet serviceName is a headless Service"), headless && headless.spec.clusterIP === "None");
    check(T("StatefulSet starts its ranks in parallel"), w.spec.podManagementPolicy === "Parallel");
  }

  // Probes point at real endpoints (the HTTP server has GET /health and /ready).
  const probePaths = { livenessProbe: "/health", readinessProbe: "/ready", startupProbe: "/health" };
  for (const [probe, want] of Object.entries(probePaths)) {
    const p = coord.c[probe];
    if (!check(T(`coordinator ${probe}`), p && p.httpGet, JSON.stringify(p))) continue;
    check(T(`coordinator ${probe} path`), p.httpGet.path === want, p.httpGet.path);
    check(T(`coordinator ${probe} port is server.http.port`), containerPort(coord.c, p.httpGet.port) === httpPort);
  }
  for (const t of templates) {
    for (const c of t.template.spec.containers) {
      for (const probe of ["livenessProbe", "readinessProbe", "startupProbe"]) {
        const g = c[probe] && c[probe].httpGet;
        if (g) check(T(`${c.name} ${probe} path is /health or /ready`), ["/health", "/ready"].includes(g.path) && isCoordinator(c), g.path);
      }
    }
  }
  // Graceful termination covers the coordinator's 30 s drain (plus the preStop pause).
  const grace = coord.template.spec.terminationGracePeriodSeconds ?? 30;
  const preStop = ((coord.c.lifecycle || {}).preStop || {}).exec;
  const pause = preStop && preStop.command[0] === "sleep" ? Number(preStop.command[1]) : 0;
  check(T("terminationGracePeriodSeconds covers the drain"), grace >= 30 + pause + 5, `${grace} s, preStop ${pause} s`);

  // Images and resources are set on every container; GPUs where the backend needs them.
  for (const t of templates) {
    for (const c of t.template.spec.containers) {
      const n = `${t.owner.kind}/${t.owner.metadata.name} ${c.name}`;
      const tag = c.image && c.image.slice(c.image.lastIndexOf("/") + 1).split(":")[1];
      check(T(`${n} image has a tag`), !!tag && tag !== "latest", c.image);
      const r = c.resources || {};
      for (const kind of ["requests", "limits"]) {
        for (const res of ["cpu", "memory"]) check(T(`${n} ${kind}.${res}`), quantity((r[kind] || {})[res]));
      }
      const gpu = (r.limits || {})["nvidia.com/gpu"];
      if (isWorker(c)) {
        if (backend === "cpu") check(T(`${n} asks for no GPU (worker.backend cpu)`), gpu === undefined, String(gpu));
        else {
          check(T(`${n} limits nvidia.com/gpu`), Number(gpu) >= 1, String(gpu));
          check(T(`${n} requests = limits for nvidia.com/gpu`), String((r.requests || {})["nvidia.com/gpu"] ?? gpu) === String(gpu));
          check(T(`${n} sets NCCL_SOCKET_IFNAME`), (c.env || []).some((e) => e.name === "NCCL_SOCKET_IFNAME" && e.value));
        }
        check(T(`${n} takes its rank from the pod (--rank auto)`), (c.args || []).join(" ").includes("--rank auto"));
      }
      if (isCoordinator(c)) check(T(`${n} asks for no GPU`), gpu === undefined);
      // The config file a Tessera process reads is the ConfigMap's.
      if (isCoordinator(c) || isWorker(c)) {
        const args = c.args || [];
        const cfgPath = args[args.indexOf("--config") + 1];
        const mount = (c.volumeMounts || []).find((m) => m.mountPath === cfgPath || cfgPath.startsWith(m.mountPath + "/"));
        const vol = mount && t.template.spec.volumes.find((v) => v.name === mount.name);
        check(T(`${n} --config ${cfgPath} is the ConfigMap's tessera.yaml`),
              vol && vol.configMap && vol.configMap.name === cm.metadata.name &&
              (mount.subPath === "tessera.yaml" || cfgPath.endsWith("/tessera.yaml")),
              JSON.stringify(vol));
      }
      for (const v of t.template.spec.volumes || []) {
        if (v.configMap) check(T(`${n} volume ${v.name} names a rendered ConfigMap`), objs.some((o) => o.kind === "ConfigMap" && o.metadata.name === v.configMap.name), v.configMap.name);
      }
      const sc = t.template.spec.securityContext || {};
      check(T(`${n} runs as non-root`), sc.runAsNonRoot === true && sc.runAsUser > 0);
    }
  }
  if (!isLws) check(T("a PodDisruptionBudget guards the workers"), objs.some((o) => o.kind === "PodDisruptionBudget" &&
    sts.some((w) => subset(o.spec.selector.matchLabels, w.spec.template.metadata.labels))));

  // What each overlay is for.
  const wspec = isLws ? null : sts[0].spec.template.spec;
  if (target === "overlays/single-node") {
    const terms = (((wspec.affinity || {}).podAffinity || {}).requiredDuringSchedulingIgnoredDuringExecution) || [];
    check(T("workers share one node (required pod affinity on the hostname)"), terms.some((x) =>
      x.topologyKey === "kubernetes.io/hostname" && subset(x.labelSelector.matchLabels, sts[0].spec.template.metadata.labels)));
  }
  if (target === "overlays/multi-node-cpu") {
    check(T("multi-node-cpu uses the CPU backend"), backend === "cpu");
    check(T("multi-node-cpu lets the ranks pick Gloo (worker.collectives auto or gloo)"),
          ["auto", "gloo", undefined].includes(worker.collectives), String(worker.collectives));
  }
  if (target === "overlays/multi-node" || target === "overlays/multi-node-cpu") {
    check(T("workers spread over nodes"), (wspec.topologySpreadConstraints || []).some((x) =>
      x.topologyKey === "kubernetes.io/hostname" && x.maxSkew === 1 && x.whenUnsatisfiable === "DoNotSchedule"));
    const anti = (((wspec.affinity || {}).podAntiAffinity || {}).requiredDuringSchedulingIgnoredDuringExecution) || [];
    check(T("at most one worker per node"), anti.some((x) => x.topologyKey === "kubernetes.io/hostname"));
  }
  if (target === "overlays/cpu-demo") {
    check(T("cpu-demo uses the CPU backend"), backend === "cpu");
    const dockerfile = readFileSync(path.join(source, "k8s/Dockerfile"), "utf8");
    const model = cfg.model.path;
    check(T(`the image holds the demo model ${model}`), model.startsWith("/opt/tessera/models/") &&
      dockerfile.includes("models " + path.dirname(model)) || dockerfile.includes(model), model);
    check(T("cpu-demo mounts no PersistentVolumeClaim"), templates.every((t) => (t.template.spec.volumes || []).every((v) => !v.persistentVolumeClaim)));
  }
  if (target === "gateway") checkGateway(objs, T, coord, httpPort, lws, podLabels, services);
  console.log(`ok   ${target}: ${objs.length} objects`);
}

// The Gateway API Inference Extension variant: the pool is the groups' coordinators on the HTTP
// port, its endpoint picker is reachable and reads metrics Tessera exports, the route leads to it.
function checkGateway(objs, T, coord, httpPort, lws, podLabels, services) {
  const pools = objs.filter((o) => o.kind === "InferencePool");
  if (!check(T("one InferencePool"), pools.length === 1)) return;
  const pool = pools[0].spec;
  check(T("several serving groups (LeaderWorkerSet replicas >= 2)"), lws.length === 1 && lws[0].spec.replicas >= 2);
  const leader = { owner: lws[0], template: lws[0].spec.leaderWorkerTemplate.leaderTemplate };
  check(T("the InferencePool selects the coordinators' pods"), subset(pool.selector.matchLabels, podLabels(leader)) &&
        leader.template.spec.containers.includes(coord.c), JSON.stringify(pool.selector));
  check(T(`the InferencePool targets server.http.port ${httpPort}`), (pool.targetPorts || []).some((p) => p.number === httpPort));
  const ref = pool.endpointPickerRef || {};
  const picker = services.find((s) => s.metadata.name === ref.name);
  check(T(`the endpoint picker's Service ${ref.name}:${ref.port && ref.port.number} exists`),
        !!picker && (picker.spec.ports || []).some((p) => p.port === (ref.port || {}).number));
  const epp = objs.find((o) => o.kind === "Deployment" && o.spec.template.spec.containers.some((c) =>
    (c.args || []).includes("--pool-name=" + pools[0].metadata.name)));
  if (check(T("an endpoint picker Deployment serves this pool"), !!epp)) {
    const args = epp.spec.template.spec.containers.flatMap((c) => c.args || []);
    const metricsSource = readFileSync(path.join(source, "coordinator/server/metrics.cc"), "utf8");
    for (const flag of ["--total-queued-requests-metric=", "--kv-cache-usage-percentage-metric=", "--lora-info-metric="]) {
      const arg = args.find((a) => a.startsWith(flag));
      const name = arg ? arg.slice(flag.length) : "";
      check(T(`the picker's ${flag.slice(0, -1)} is a metric Tessera exports (${name})`), name !== "" && metricsSource.includes(`"${name}"`));
    }
    const sa = epp.spec.template.spec.serviceAccountName;
    const binding = objs.find((o) => o.kind === "RoleBinding" && o.subjects.some((x) => x.name === sa));
    const role = binding && objs.find((o) => o.kind === "Role" && o.metadata.name === binding.roleRef.name);
    const canRead = (group, resource) => role && role.rules.some((r) => r.apiGroups.includes(group) &&
      r.resources.includes(resource) && ["get", "list", "watch"].every((v) => r.verbs.includes(v)));
    check(T("the picker may read InferencePools and pods"), canRead("inference.networking.k8s.io", "inferencepools") && canRead("", "pods"));
  }
  const routes = objs.filter((o) => o.kind === "HTTPRoute");
  check(T("an HTTPRoute leads to the InferencePool"), routes.some((r) => (r.spec.rules || []).some((rule) =>
    (rule.backendRefs || []).some((b) => b.kind === "InferencePool" && b.group === "inference.networking.k8s.io" &&
      b.name === pools[0].metadata.name))));
}

for (const target of ["overlays/single-node", "overlays/multi-node", "overlays/multi-node-cpu", "overlays/cpu-demo", "lws", "gateway"]) {
  await checkRendering(target);
}
const version = execFileSync(kubectl, ["version", "--client"], { stdio: ["ignore", "pipe", "ignore"] }).toString().split("\n")[0];
console.log(`${passed} checks passed, ${failed} failed (${kubectl}: ${version})`);
process.exit(failed ? 1 : 0);
