// chatgolden.mjs renders the chat-template golden files for package chat
// with @huggingface/jinja, the Jinja engine of transformers.js.
//
// Usage (from the repository root):
//   (cd /tmp && npm install @huggingface/jinja@0.5.11)
//   node tools/refgen/chatgolden.mjs /tmp/node_modules chat/testdata
//
// It reads <testdata>/golden/cases.json (templates, shared tool list, cases),
// renders every case with every template it applies to, and writes
// <testdata>/golden/<template>/<case>.txt with the exact output, or
// <case>.err with {"raised": bool, "message": string} when rendering fails
// ("raised" is true when the template called raise_exception).
//
// The context mirrors what chat.Render builds from the same case, which is
// also what transformers' apply_chat_template passes:
//   - messages: role and content always; reasoning_content, tool_calls,
//     tool_call_id and name only when non-empty; tool call type defaults to
//     "function"; tool call arguments become an object when they are a JSON
//     object, and stay a string otherwise;
//   - tools: the shared tool list when the case sets "tools", else null;
//   - add_generation_prompt; enable_thinking only when the case sets it;
//   - bos_token, eos_token and vars from the template entry ("drop_vars"
//     removes some for a case);
//   - strftime_now formats a fixed clock (the case's "now", default
//     2024-07-26T00:00:00Z, in UTC) with Python's C-locale directives.
import { readFileSync, writeFileSync, mkdirSync, rmSync, existsSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [nodeModules, testdata] = process.argv.slice(2);
if (!nodeModules || !testdata) {
  console.error("usage: node chatgolden.mjs <node_modules dir> <chat testdata dir>");
  process.exit(2);
}
const jinjaDir = join(nodeModules, "@huggingface", "jinja");
const { Template, Environment } = await import(pathToFileURL(join(jinjaDir, "dist", "index.js")).href);

// The engine declares raise_exception and strftime_now itself and refuses to
// redeclare a variable; let the two functions of this script replace them
// (to tell raised errors apart, and for a fixed clock).
const overrides = new Set();
const declare = Environment.prototype.set;
Environment.prototype.set = function (name, value) {
  if (overrides.has(value)) this.variables.delete(name);
  return declare.call(this, name, value);
};
const jinjaVersion = JSON.parse(readFileSync(join(jinjaDir, "package.json"), "utf8")).version;

const spec = JSON.parse(readFileSync(join(testdata, "golden", "cases.json"), "utf8"));

const MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
  "October", "November", "December"];
const DAYS = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"];
const pad = (n, w) => String(n).padStart(w, "0");

// strftime with Python's C-locale meaning for the directives chat templates use.
function strftime(d, fmt) {
  return fmt.replace(/%(-?)([aAbBdHIjmMpSyY%])/g, (_, noPad, c) => {
    const p = (n, w) => (noPad ? String(n) : pad(n, w));
    const h12 = d.getUTCHours() % 12 || 12;
    const yday = Math.floor((Date.UTC(d.getUTCFullYear(), d.getUTCMonth(), d.getUTCDate()) -
      Date.UTC(d.getUTCFullYear(), 0, 1)) / 86400000) + 1;
    switch (c) {
      case "a": return DAYS[d.getUTCDay()].slice(0, 3);
      case "A": return DAYS[d.getUTCDay()];
      case "b": return MONTHS[d.getUTCMonth()].slice(0, 3);
      case "B": return MONTHS[d.getUTCMonth()];
      case "d": return p(d.getUTCDate(), 2);
      case "H": return p(d.getUTCHours(), 2);
      case "I": return p(h12, 2);
      case "j": return p(yday, 3);
      case "m": return p(d.getUTCMonth() + 1, 2);
      case "M": return p(d.getUTCMinutes(), 2);
      case "p": return d.getUTCHours() < 12 ? "AM" : "PM";
      case "S": return p(d.getUTCSeconds(), 2);
      case "y": return p(d.getUTCFullYear() % 100, 2);
      case "Y": return String(d.getUTCFullYear());
      case "%": return "%";
    }
  });
}

function argumentsValue(args) {
  try {
    const v = JSON.parse(args);
    if (v !== null && typeof v === "object" && !Array.isArray(v)) return v;
  } catch {
    // not JSON: the template gets the string
  }
  return args;
}

function messageValue(m) {
  const out = { role: m.role, content: m.content ?? "" };
  if (m.reasoning_content) out.reasoning_content = m.reasoning_content;
  if (m.tool_calls && m.tool_calls.length > 0) {
    out.tool_calls = m.tool_calls.map((tc) => {
      const c = {};
      if (tc.id) c.id = tc.id;
      c.type = tc.type || "function";
      c.function = { name: tc.function.name, arguments: argumentsValue(tc.function.arguments) };
      return c;
    });
  }
  if (m.tool_call_id) out.tool_call_id = m.tool_call_id;
  if (m.name) out.name = m.name;
  return out;
}

class RaisedError extends Error {}
const raiseException = (msg) => {
  throw new RaisedError(String(msg));
};
overrides.add(raiseException);

const goldenDir = join(testdata, "golden");
let written = 0;
for (const [tname, tspec] of Object.entries(spec.templates)) {
  const source = readFileSync(join(testdata, tspec.file), "utf8");
  const template = new Template(source);
  const dir = join(goldenDir, tname);
  if (existsSync(dir)) rmSync(dir, { recursive: true });
  mkdirSync(dir, { recursive: true });
  for (const c of spec.cases) {
    if (c.templates && !c.templates.includes(tname)) continue;
    const now = new Date(c.now ?? "2024-07-26T00:00:00Z");
    const ctx = {};
    for (const [k, v] of Object.entries(tspec.vars ?? {})) {
      if (!(c.drop_vars ?? []).includes(k)) ctx[k] = v;
    }
    Object.assign(ctx, {
      messages: c.messages.map(messageValue),
      add_generation_prompt: !!c.add_generation_prompt,
      tools: c.tools ? spec.tools : null,
      bos_token: tspec.bos_token,
      eos_token: tspec.eos_token,
      raise_exception: raiseException,
      strftime_now: (fmt) => strftime(now, fmt),
    });
    overrides.add(ctx.strftime_now);
    if (c.enable_thinking !== undefined) ctx.enable_thinking = c.enable_thinking;
    try {
      writeFileSync(join(dir, c.name + ".txt"), template.render(ctx));
    } catch (err) {
      const raised = err instanceof RaisedError;
      writeFileSync(join(dir, c.name + ".err"), JSON.stringify({ raised, message: err.message }) + "\n");
    }
    written++;
  }
}
// Whitespace control: random small templates built from text with spaces,
// tabs and newlines, and tags with random "-" markers, rendered as they are.
// ("+" markers, {% raw %}, "\r", and Unicode spaces where lstrip_blocks
// would remove them are left out: @huggingface/jinja does not support the
// first two, does not normalise "\r" and lstrips only spaces and tabs, where
// Jinja2 does; package chat follows Jinja2 there and tests it by hand.)
let seed = 20250305; // mulberry32
const rnd = (n) => {
  seed = (seed + 0x6d2b79f5) | 0;
  let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
  return (((t ^ (t >>> 14)) >>> 0) % n);
};
const pick = (xs) => xs[rnd(xs.length)];
const texts = ["a", "b c", " ", "  ", "\t", "\n", "\n\n", "  \n", "\n  ", " \n\t ", "x\n  ", "x\u3000"];
const mark = () => pick(["", "", "-"]);
function genBlock(depth) {
  let out = "";
  const n = 1 + rnd(4);
  for (let i = 0; i < n; i++) {
    switch (rnd(depth > 2 ? 4 : 6)) {
      case 0: case 1: out += pick(texts); break;
      case 2: out += `{{${mark()} v ${mark()}}}`; break;
      case 3: out += `{#${mark()} c ${mark()}#}`; break;
      case 4:
        out += `{%${mark()} if flag ${mark()}%}` + genBlock(depth + 1) +
          (rnd(2) ? `{%${mark()} else ${mark()}%}` + genBlock(depth + 1) : "") + `{%${mark()} endif ${mark()}%}`;
        break;
      case 5:
        out += `{%${mark()} for v in items ${mark()}%}` + genBlock(depth + 1) + `{%${mark()} endfor ${mark()}%}`;
        break;
    }
  }
  return out;
}
const wsCases = [];
for (let i = 0; i < 400; i++) {
  const src = genBlock(0) + (rnd(4) === 0 ? "\n" : "");
  const ctx = { flag: rnd(2) === 1, items: ["1", "2"], v: "V" };
  wsCases.push({ template: src, flag: ctx.flag, output: new Template(src).render(ctx) });
}
writeFileSync(join(goldenDir, "whitespace.json"), JSON.stringify(wsCases, null, 1) + "\n");

writeFileSync(join(goldenDir, "GENERATOR"),
  `tools/refgen/chatgolden.mjs with @huggingface/jinja ${jinjaVersion} on node ${process.version}\n`);
console.error(`wrote ${written} golden files with @huggingface/jinja ${jinjaVersion}`);
