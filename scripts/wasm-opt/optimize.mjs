#!/usr/bin/env node
// Shrinks a linked component in place: runs Binaryen's `wasm-opt -Oz` on its main core module
// and drops the component-level `component-name` section (names for debuggers, ~10 KB).
//
//   node scripts/wasm-opt/optimize.mjs <component.wasm>
//
// Called by scripts/link-component after every link for wasm32-wasip2. wasm-opt cannot read
// components, so the component's top-level sections are walked and only the largest core
// module (the Rust code; the others are the few-hundred-byte adapter shims that
// wit-component adds) is replaced by its optimized form. Imports and exports keep their names
// and types, so the rest of the component still fits it; the result is validated by the
// runtime that loads it (and by the tests, which run these very files).

import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const WASM_OPT = join(dirname(fileURLToPath(import.meta.url)), "node_modules/binaryen/bin/wasm-opt");
// The features rustc's generic wasm32 CPU uses (wasm 2.0), and no others: with more enabled
// Binaryen may write newer encodings (compact imports, say) that runtimes refuse.
const FEATURES = [
  "bulk-memory",
  "bulk-memory-opt",
  "call-indirect-overlong",
  "multivalue",
  "mutable-globals",
  "nontrapping-float-to-int",
  "reference-types",
  "sign-ext",
];
const WASM_OPT_FLAGS = [
  "-Oz",
  "--mvp-features",
  ...FEATURES.map((f) => `--enable-${f}`),
  "--strip-debug",
  "--strip-producers",
];
const COMPONENT_HEADER = Buffer.from([0x00, 0x61, 0x73, 0x6d, 0x0d, 0x00, 0x01, 0x00]);
const CUSTOM = 0;
const CORE_MODULE = 1;

function readU32(bytes, at) {
  let value = 0;
  for (let shift = 0, i = at; i < bytes.length && shift < 35; shift += 7, i++) {
    value += (bytes[i] & 0x7f) * 2 ** shift;
    if ((bytes[i] & 0x80) === 0) return [value, i + 1];
  }
  throw new Error("malformed LEB128 section size");
}

function u32(value) {
  const out = [];
  do {
    let byte = value & 0x7f;
    value = Math.floor(value / 128);
    if (value > 0) byte |= 0x80;
    out.push(byte);
  } while (value > 0);
  return Buffer.from(out);
}

/** The top-level sections: { id, start, end } with `start..end` the section's contents. */
function sections(bytes) {
  const found = [];
  let at = COMPONENT_HEADER.length;
  while (at < bytes.length) {
    const id = bytes[at];
    const [size, start] = readU32(bytes, at + 1);
    if (start + size > bytes.length) throw new Error("a section runs past the end of the file");
    found.push({ id, start, end: start + size });
    at = start + size;
  }
  return found;
}

function customName(bytes, section) {
  const [length, at] = readU32(bytes, section.start);
  return bytes.subarray(at, at + length).toString("utf8");
}

function main(path) {
  const bytes = readFileSync(path);
  if (!bytes.subarray(0, 8).equals(COMPONENT_HEADER)) {
    console.error(`optimize.mjs: ${path} is not a component; left as it is`);
    return;
  }
  const all = sections(bytes);
  const modules = all.filter((s) => s.id === CORE_MODULE);
  if (modules.length === 0) return;
  const main = modules.reduce((a, b) => (b.end - b.start > a.end - a.start ? b : a));
  const dir = mkdtempSync(join(tmpdir(), "leasegate-wasm-opt-"));
  let optimized;
  try {
    writeFileSync(join(dir, "in.wasm"), bytes.subarray(main.start, main.end));
    execFileSync(process.execPath, [WASM_OPT, ...WASM_OPT_FLAGS, join(dir, "in.wasm"), "-o", join(dir, "out.wasm")], {
      stdio: ["ignore", "inherit", "inherit"],
    });
    optimized = readFileSync(join(dir, "out.wasm"));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  const parts = [COMPONENT_HEADER];
  for (const s of all) {
    if (s.id === CUSTOM && customName(bytes, s) === "component-name") continue;
    const contents = s === main ? optimized : bytes.subarray(s.start, s.end);
    parts.push(Buffer.from([s.id]), u32(contents.length), contents);
  }
  const out = Buffer.concat(parts);
  writeFileSync(path, out);
  console.error(`optimize.mjs: ${path}: ${bytes.length} -> ${out.length} bytes`);
}

if (process.argv.length !== 3) {
  console.error("usage: node scripts/wasm-opt/optimize.mjs <component.wasm>");
  process.exit(2);
}
main(process.argv[2]);
