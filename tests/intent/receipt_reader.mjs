// A consumer of corral's intent records, as a Node program that knows only the
// reference guard's wire 1.0 shapes (execution-fidelity-guard spec/*.schema.json,
// seed 000 "Wire 版本"): it picks the shape by each record's schema_version, checks
// every field, and recomputes a contract document's snapshot_sha256 itself.
// Written for corral's conformance test (tests/test_intent_conformance.py); no
// dependencies. Usage: node receipt_reader.mjs FILE, where FILE holds
// {"receipts": [...], "snapshots": [...], "contracts": [...]}. Prints a JSON report.
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";

const RFC3339 = /^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$/;
const EVIDENCE_SOURCES = ["file", "command", "test", "api", "database", "real_page", "release", "user"];

const isObject = (v) => v !== null && typeof v === "object" && !Array.isArray(v);
const text = (v) => typeof v === "string" && v.length > 0;
const texts = (v, min = 0) => Array.isArray(v) && v.length >= min && v.every(text);
const dateTime = (v) => typeof v === "string" && RFC3339.test(v) && !Number.isNaN(Date.parse(v));
const positiveInteger = (v) => Number.isInteger(v) && v >= 1;
const oneOf = (...values) => (v) => values.includes(v);
const nullableText = (v) => v === null || typeof v === "string";

// field -> [required, check]
const SHAPES = {
  receipt: {
    "1.0": {
      schema_version: [true, oneOf("1.0")],
      receipt_id: [true, text],
      event_ref: [true, text],
      contract_ref: [true, text],
      contract_version: [true, positiveInteger],
      decision: [true, oneOf("continue", "remind", "ask", "block", "continue_verification")],
      authority: [true, oneOf("deterministic_rule", "semantic_candidate", "external_evidence", "user", "native_codex")],
      severity: [true, oneOf("low", "medium", "high", "critical")],
      reason_codes: [true, (v) => texts(v, 1)],
      rule_ids: [false, (v) => texts(v)],
      evidence_refs: [true, (v) => texts(v)],
      visibility: [true, oneOf("silent", "model", "user")],
      reversible: [true, (v) => typeof v === "boolean"],
      coverage: [true, oneOf("observed", "partial", "unobserved")],
      unlock: [false, nullableText],
      semantic_model: [false, nullableText],
      decided_at: [true, dateTime],
      latency_ms: [true, (v) => typeof v === "number" && Number.isFinite(v) && v >= 0],
    },
  },
  snapshot: {
    "1.0": {
      schema_version: [true, oneOf("1.0")],
      contract_ref: [true, text],
      contract_version: [true, positiveInteger],
      phase: [true, text],
      open_commitments: [true, (v) => texts(v)],
      evidence_refs: [true, (v) => texts(v)],
      captured_at: [true, dateTime],
    },
  },
  envelope: {
    "1.0": {
      schema_version: [true, oneOf("1.0")],
      contract_ref: [true, (v) => text(v) && v.trim().length > 0],
      contract_version: [true, positiveInteger],
      source: [true, oneOf("user-intent-plugin")],
      source_message_refs: [true, (v) => texts(v)],
      snapshot_sha256: [true, (v) => typeof v === "string" && /^[a-f0-9]{64}$/.test(v)],
      updated_at: [true, dateTime],
    },
  },
};

function checkShape(kind, record, where, errors) {
  if (!isObject(record)) return errors.push(`${where}: not an object`);
  const shape = SHAPES[kind][record.schema_version];
  if (!shape) return errors.push(`${where}: no ${kind} shape for schema_version ${JSON.stringify(record.schema_version)}`);
  for (const key of Object.keys(record)) {
    if (!(key in shape)) errors.push(`${where}: unexpected field ${key}`);
  }
  for (const [key, [required, check]] of Object.entries(shape)) {
    if (!(key in record)) {
      if (required) errors.push(`${where}: missing ${key}`);
    } else if (!check(record[key])) {
      errors.push(`${where}: bad ${key}: ${JSON.stringify(record[key])}`);
    }
  }
}

function sorted(value) {
  if (Array.isArray(value)) return value.map(sorted);
  if (isObject(value)) {
    const out = {};
    for (const key of Object.keys(value).sort()) out[key] = sorted(value[key]);
    return out;
  }
  return value;
}
const canonicalSha256 = (value) => createHash("sha256").update(JSON.stringify(sorted(value)), "utf8").digest("hex");

function checkProjection(p, where, errors) {
  const fields = ["objective", "primary_object", "delivery_surface", "scope", "must_and_must_not", "authorization",
    "completion_evidence"];
  if (!isObject(p)) return errors.push(`${where}: not an object`);
  const keys = Object.keys(p);
  if (keys.length !== fields.length || !fields.every((f) => keys.includes(f))) {
    errors.push(`${where}: needs exactly ${fields.join(", ")}`);
    return;
  }
  const filled = (v) => typeof v === "string" && v.trim().length > 0;
  if (!filled(p.objective) || !filled(p.primary_object)) errors.push(`${where}: blank objective or primary_object`);
  if (!texts(p.delivery_surface, 1)) errors.push(`${where}: bad delivery_surface`);
  if (!isObject(p.scope) || !texts(p.scope.include) || !texts(p.scope.exclude)) errors.push(`${where}: bad scope`);
  if (!isObject(p.must_and_must_not) || !texts(p.must_and_must_not.must) || !texts(p.must_and_must_not.must_not)) {
    errors.push(`${where}: bad must_and_must_not`);
  }
  const a = p.authorization;
  if (!isObject(a) || !texts(a.allowed) || !texts(a.requires_user) || !texts(a.forbidden)) {
    errors.push(`${where}: bad authorization`);
  }
  const ok = Array.isArray(p.completion_evidence) && p.completion_evidence.length >= 1 &&
    p.completion_evidence.every((item) => isObject(item) && text(item.requirement) &&
      texts(item.acceptable_sources, 1) && item.acceptable_sources.every((s) => EVIDENCE_SOURCES.includes(s)));
  if (!ok) errors.push(`${where}: bad completion_evidence`);
}

function checkContract(doc, where, errors) {
  if (isObject(doc) && "envelope" in doc && "projection" in doc) {
    if (Object.keys(doc).length !== 2) errors.push(`${where}: a provider document holds envelope and projection only`);
    checkShape("envelope", doc.envelope, `${where}.envelope`, errors);
    checkProjection(doc.projection, `${where}.projection`, errors);
    if (isObject(doc.envelope) && doc.envelope.snapshot_sha256 !== canonicalSha256(doc.projection)) {
      errors.push(`${where}: snapshot_sha256 does not match the canonical projection`);
    }
    return { ref: doc.envelope?.contract_ref, version: doc.envelope?.contract_version };
  }
  checkProjection(doc, where, errors);
  return { ref: "lite:" + canonicalSha256(doc).slice(0, 20), version: 1 };
}

const input = JSON.parse(readFileSync(process.argv[2], "utf8"));
const errors = [];
const decisions = {};
const authorities = {};
(input.receipts ?? []).forEach((receipt, i) => {
  checkShape("receipt", receipt, `receipts[${i}]`, errors);
  decisions[receipt.decision] = (decisions[receipt.decision] ?? 0) + 1;
  authorities[receipt.authority] = (authorities[receipt.authority] ?? 0) + 1;
});
(input.snapshots ?? []).forEach((snapshot, i) => checkShape("snapshot", snapshot, `snapshots[${i}]`, errors));
const identities = (input.contracts ?? []).map((doc, i) => checkContract(doc, `contracts[${i}]`, errors));
process.stdout.write(JSON.stringify({
  read: { receipts: input.receipts?.length ?? 0, snapshots: input.snapshots?.length ?? 0,
    contracts: input.contracts?.length ?? 0 },
  decisions,
  authorities,
  identities,
  errors,
}) + "\n");
