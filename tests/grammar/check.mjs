#!/usr/bin/env node
// Checks a query corpus against Grafana's own grammar for the language:
//
//   node tests/grammar/check.mjs <logql|traceql> <valid.txt> <invalid.txt>
//
// Each file holds one query per line; blank lines and lines starting with
// `#` are skipped. Every line of the valid file must parse, every line of
// the invalid file must be refused. The lezer parsers recover from
// errors, so "refused" means the tree holds an error node (`⚠`) or the
// parser in strict mode (no recovery) throws. Prints one line per
// disagreement and a summary; exits 1 on any disagreement, 2 on a usage
// error. Mira's own parsers read the same files in their unit tests, so
// the corpus is what both agree on.
//
// The grammars come from tests/grammar/node_modules: run
// `npm ci --prefix tests/grammar` first.

import { readFileSync } from 'node:fs';

const GRAMMARS = {
  logql: '@grafana/lezer-logql',
  traceql: '@grafana/lezer-traceql',
};

const [lang, validPath, invalidPath] = process.argv.slice(2);
if (!GRAMMARS[lang] || !validPath || !invalidPath) {
  console.error(`usage: node check.mjs <${Object.keys(GRAMMARS).join('|')}> <valid.txt> <invalid.txt>`);
  process.exit(2);
}
const { parser } = await import(GRAMMARS[lang]);
const strict = parser.configure({ strict: true });

/** Where the first error is, or null when the query parses. */
function firstError(query) {
  const cursor = parser.parse(query).cursor();
  do {
    if (cursor.type.isError) {
      return cursor.from;
    }
  } while (cursor.next());
  try {
    strict.parse(query);
  } catch (e) {
    return e.message;
  }
  return null;
}

/** [line number, query] for every query line of a corpus file. */
function corpus(path) {
  return readFileSync(path, 'utf8')
    .split('\n')
    .map((line, i) => [i + 1, line.replace(/\r$/, '')])
    .filter(([, line]) => line.trim() !== '' && !line.startsWith('#'));
}

let checked = 0;
let disagreements = 0;
for (const [path, wantValid] of [[validPath, true], [invalidPath, false]]) {
  for (const [n, query] of corpus(path)) {
    checked += 1;
    const at = firstError(query);
    if (wantValid && at !== null) {
      disagreements += 1;
      console.log(`${path}:${n}: ${lang} grammar refuses (error at ${at}): ${query}`);
    } else if (!wantValid && at === null) {
      disagreements += 1;
      console.log(`${path}:${n}: ${lang} grammar accepts: ${query}`);
    }
  }
}
console.log(`${lang}: ${checked} queries checked against ${GRAMMARS[lang]}, ${disagreements} disagreements`);
process.exit(disagreements === 0 ? 0 : 1);
