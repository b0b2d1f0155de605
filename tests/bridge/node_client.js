// A second, independent bridge client (Node, no dependencies), for the tests:
//   node node_client.js URL TOKEN   -> reads {"method", "params"} lines on stdin,
//                                      writes each JSON-RPC reply as one line;
//   node node_client.js --digest    -> reads a JSON list of {"method", "params"} and
//                                      prints the canonical request digests (RFC 8785
//                                      over the safe-integer subset, then SHA-256).
"use strict";
const crypto = require("crypto");
const http = require("http");
const readline = require("readline");

function jcs(v) {
  if (v === null || typeof v !== "object") {
    if (typeof v === "number" && !Number.isSafeInteger(v)) throw new Error("unsafe number " + v);
    return JSON.stringify(v);
  }
  if (Array.isArray(v)) return "[" + v.map(jcs).join(",") + "]";
  // Object keys sort by UTF-16 code units, as RFC 8785 says.
  const keys = Object.keys(v).sort();
  return "{" + keys.map((k) => JSON.stringify(k) + ":" + jcs(v[k])).join(",") + "}";
}

function requestDigest(method, params) {
  const rest = {};
  for (const k of Object.keys(params)) if (k !== "idempotency_key") rest[k] = params[k];
  return crypto.createHash("sha256").update(jcs({ method, params: rest }), "utf8").digest("hex");
}

function post(url, token, body) {
  return new Promise((resolve, reject) => {
    const target = new URL("/rpc", url);
    const data = Buffer.from(JSON.stringify(body));
    const req = http.request(target, {
      method: "POST",
      headers: { Authorization: "Bearer " + token, "Content-Type": "application/json", "Content-Length": data.length },
    }, (res) => {
      const chunks = [];
      res.on("data", (c) => chunks.push(c));
      res.on("end", () => resolve(JSON.parse(Buffer.concat(chunks).toString("utf8"))));
    });
    req.on("error", reject);
    req.end(data);
  });
}

async function main() {
  if (process.argv[2] === "--digest") {
    const vectors = JSON.parse(require("fs").readFileSync(0, "utf8"));
    console.log(JSON.stringify(vectors.map((v) => requestDigest(v.method, v.params))));
    return;
  }
  const [url, token] = process.argv.slice(2);
  let id = 0;
  const lines = readline.createInterface({ input: process.stdin });
  for await (const line of lines) {
    if (!line.trim()) continue;
    const { method, params } = JSON.parse(line);
    const mutating = !/\.(get|discover|list|read|open|info|whoami)$/.test(method);
    if (mutating && params.idempotency_key === undefined) params.idempotency_key = "n-" + crypto.randomBytes(12).toString("hex");
    const reply = await post(url, token, { jsonrpc: "2.0", id: ++id, method, params });
    process.stdout.write(JSON.stringify(reply) + "\n");
  }
}

main().catch((err) => { console.error(String(err)); process.exit(1); });
