// Checks a corpus of queries against Grafana's own lezer grammar.
//
//   node tests/grammar/check.mjs <logql|traceql> <valid.txt> <invalid.txt>
//
// Every line of valid.txt must parse without an error node, every line of
// invalid.txt must produce one (lezer recovers from errors, so a refused
// query still yields a tree: it is the error node that says "refused").
// Blank lines and lines starting with `#` are skipped. Prints one line per
// disagreement and a summary; exits 1 on any disagreement.
import { readFileSync } from 'node:fs';

const grammars = {
  logql: '@grafana/lezer-logql',
  traceql: '@grafana/lezer-traceql',
};

const [lang, validFile, invalidFile] = process.argv.slice(2);
if (!grammars[lang] || !validFile || !invalidFile) {
  console.error('usage: node check.mjs <logql|traceql> <valid.txt> <invalid.txt>');
  process.exit(2);
}
const { parser } = await import(grammars[lang]);

function queries(file) {
  return readFileSync(file, 'utf8')
    .split('\n')
    .map((line, i) => ({ line: i + 1, text: line.replace(/\r$/, '') }))
    .filter(({ text }) => text.trim() !== '' && !text.startsWith('#'));
}

function accepts(query) {
  const cursor = parser.parse(query).cursor();
  do {
    if (cursor.type.isError) return false;
  } while (cursor.next());
  return true;
}

let disagreements = 0;
let total = 0;
for (const [file, want] of [[validFile, true], [invalidFile, false]]) {
  for (const { line, text } of queries(file)) {
    total += 1;
    if (accepts(text) !== want) {
      disagreements += 1;
      console.log(`${file}:${line}: lezer ${want ? 'refuses' : 'accepts'}: ${text}`);
    }
  }
}
console.log(`${lang}: ${total - disagreements} agree, ${disagreements} disagree`);
process.exit(disagreements === 0 ? 0 : 1);
