// The canonical hash as the reference guard computes it (seed 000: object keys
// sorted recursively, array order kept, JSON text, SHA-256 of its UTF-8), written
// for corral's conformance test. Reads a JSON array of values on stdin, prints a
// JSON array of lowercase hex digests.
import { createHash } from "node:crypto";

function sorted(value) {
  if (Array.isArray(value)) return value.map(sorted);
  if (value !== null && typeof value === "object") {
    const out = {};
    for (const key of Object.keys(value).sort()) out[key] = sorted(value[key]);
    return out;
  }
  return value;
}

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const values = JSON.parse(Buffer.concat(chunks).toString("utf8"));
const digests = values.map((value) =>
  createHash("sha256").update(JSON.stringify(sorted(value)), "utf8").digest("hex"),
);
process.stdout.write(JSON.stringify(digests) + "\n");
