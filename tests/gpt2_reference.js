// tests/gpt2_reference.js — a reference GPT-2 encoding, for tests/test_bpe.cpp
// and tools/bench_bpe.
//
//   node tests/gpt2_reference.js [--encoder tiktoken|gpt-3-encoder] [--special all|none]
//                                [--repeat N] FILE
//   node tests/gpt2_reference.js --decode-hex FILE
//
// Reads FILE as UTF-8 (as Node does: each maximal invalid subsequence becomes
// U+FFFD), encodes it with js-tiktoken's "gpt2" encoding (default) or with
// gpt-3-encoder's encode(), and prints the ids on one line, separated by
// spaces. --special all: a literal <|endoftext|> is token 50256
// (js-tiktoken's encode(text, "all")); none: it is ordinary text
// (encode(text, [], [])). gpt-3-encoder knows no special tokens, so it takes
// --special none only. --repeat N encodes N times and prints, on stderr, the
// milliseconds of each encoding (the benchmark's timings), not counting the
// file's reading and decoding. --decode-hex: each line of FILE is bytes in
// hex; prints each decoded as Node decodes UTF-8 and encoded back, in hex
// (what the reference sees of those bytes). The packages are found through
// NODE_PATH.
'use strict';
const fs = require('fs');

function fail(msg) {
  process.stderr.write('gpt2_reference.js: ' + msg + '\n');
  process.exit(2);
}

let encoderName = 'tiktoken', special = 'all', repeat = 0, file = null, decodeHex = false;
const args = process.argv.slice(2);
for (let i = 0; i < args.length; i++) {
  if (args[i] === '--encoder') encoderName = args[++i];
  else if (args[i] === '--special') special = args[++i];
  else if (args[i] === '--repeat') repeat = parseInt(args[++i], 10);
  else if (args[i] === '--decode-hex') decodeHex = true;
  else if (file === null) file = args[i];
  else fail('unexpected argument ' + args[i]);
}
if (file === null) fail('usage: node tests/gpt2_reference.js [--encoder tiktoken|gpt-3-encoder] [--special all|none] [--repeat N] FILE');
if (special !== 'all' && special !== 'none') fail('--special: all or none');
if (!(repeat >= 0)) fail('--repeat: a count');

if (decodeHex) {
  const lines = fs.readFileSync(file, 'latin1').split('\n').filter((l) => l.length > 0);
  const out = lines.map((l) => Buffer.from(Buffer.from(l, 'hex').toString('utf8'), 'utf8').toString('hex'));
  process.stdout.write(out.join('\n') + '\n');
  process.exit(0);
}

let encode;
if (encoderName === 'tiktoken') {
  const { Tiktoken } = require('js-tiktoken/lite');
  const ranks = require('js-tiktoken/ranks/gpt2');
  const enc = new Tiktoken(ranks.default || ranks);
  encode = special === 'all' ? (t) => enc.encode(t, 'all') : (t) => enc.encode(t, [], []);
} else if (encoderName === 'gpt-3-encoder') {
  if (special !== 'none') fail('gpt-3-encoder has no special tokens: use --special none');
  encode = require('gpt-3-encoder').encode;
} else {
  fail('--encoder: tiktoken or gpt-3-encoder');
}

const text = fs.readFileSync(file).toString('utf8');
let ids = encode(text);
if (repeat > 0) {
  const ms = [];
  for (let r = 0; r < repeat; r++) {
    const t0 = process.hrtime.bigint();
    ids = encode(text);
    ms.push(Number(process.hrtime.bigint() - t0) / 1e6);
  }
  process.stderr.write('ms ' + ms.map((x) => x.toFixed(3)).join(' ') + '\n');
}
process.stdout.write(ids.join(' ') + '\n');
