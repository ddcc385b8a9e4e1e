#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets: tests/fuzz/corpus/NAME/, a few
valid files of each format (small shapes) and edge cases around each check.
Run from anywhere: python3 tests/fuzz/make_corpus.py. The files are committed;
rerun after a format changes."""
import os
import shutil
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "corpus")


def header(*fields):
    ints = list(fields) + [0] * (256 - len(fields))
    return struct.pack("<256i", *ints)


def param_count(maxT, V, L, NH, C, Vp):
    return Vp * C + maxT * C + L * (C + C + 3 * C * C + 3 * C + C * C + C + C + C + 4 * C * C + 4 * C + 4 * C * C + C) + 2 * C


def model_file(version, maxT, V, L, NH, C, Vp, extra=b"", cut=0):
    n = param_count(maxT, V, L, NH, C, Vp)
    if version == 5:
        body = struct.pack("<%dH" % n, *[(0x3F80 + i) & 0xFFFF for i in range(n)])
    else:
        body = struct.pack("<%df" % n, *[0.01 * (i % 97) for i in range(n)])
    data = header(20240326, version, maxT, V, L, NH, C, Vp) + body + extra
    return data[: len(data) - cut]


def state_file(n, attn=(0, 16, 0, 0, 0, 16, 0, 0, 3, 8), claimed=None, cut=0):
    ints = [0] * 256
    ints[0:7] = [20240527, 1, 1, 0, 0, 0, 1]
    ints[10] = 7
    ints[11] = 12
    ints[50:60] = list(attn)
    h = bytearray(struct.pack("<256i", *ints))
    struct.pack_into("<Q", h, 20 * 4, 0x123456789)
    struct.pack_into("<Q", h, 40 * 4, n if claimed is None else claimed)
    body = struct.pack("<%df" % (2 * n), *[0.001 * i for i in range(2 * n)])
    data = bytes(h) + body
    return data[: len(data) - cut]


def shard(tokens, claimed=None, magic=20240520, version=1):
    ntok = len(tokens) if claimed is None else claimed
    return header(magic, version, ntok) + struct.pack("<%dH" % len(tokens), *tokens)


def tokenizer_file(pieces, version=2, eot=0, vocab=None):
    h = struct.pack("<256I", *([20240328, version, len(pieces) if vocab is None else vocab, eot] + [0] * 252))
    return h + b"".join(bytes([len(p)]) + p for p in pieces)


TEXT = b"First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n"


def corpus():
    c = {}
    c["fuzz_model_file"] = {
        "v3_tiny": model_file(3, 1, 1, 1, 1, 1, 1),
        "v3_small": model_file(3, 4, 5, 2, 2, 4, 8),
        "v5_small": model_file(5, 4, 5, 2, 2, 4, 8),
        "v5_tiny": model_file(5, 1, 1, 1, 1, 1, 1),
        "header_only": header(20240326, 3, 1, 1, 1, 1, 1, 1),
        "truncated": model_file(3, 4, 5, 2, 2, 4, 8, cut=5),
        "trailing": model_file(5, 1, 1, 1, 1, 1, 1, extra=b"\0\0"),
        "bad_magic": header(20240327, 3, 1, 1, 1, 1, 1, 1),
        "version_4": header(20240326, 4, 1, 1, 1, 1, 1, 1),
        "negative_layers": header(20240326, 3, 1, 1, -1, 1, 1, 1),
        "padded_below_vocab": header(20240326, 3, 1, 8, 1, 1, 1, 4),
        "heads_not_dividing": header(20240326, 3, 1, 1, 1, 3, 4, 1),
        "huge_shape": header(20240326, 3, 1 << 30, 1 << 30, 1 << 30, 1, 1 << 30, 1 << 30),
        "wrapping_shape": header(20240326, 5, 1, 1, 4, 1, 1 << 30, 1),
        "short": b"\x06\x1a\x35\x01",
    }
    c["fuzz_state_file"] = {
        "tiny": state_file(29),
        "empty_moments": state_file(0),
        "knn_settings": state_file(5, attn=(1, 4, 0, 1, 1, 8, 2, 1, 3, 8)),
        "truncated": state_file(29, cut=3),
        "claims_more": state_file(3, claimed=1 << 40),
        "claims_wrap": state_file(3, claimed=(1 << 62) + 3),
        "bad_mode": state_file(2, attn=(9, 16, 0, 0, 0, 16, 0, 0, 3, 8)),
        "negative_index": state_file(2, attn=(0, 16, 0, -1, 0, 16, 0, 0, 3, 8)),
        "header_only": state_file(0)[:1024],
        "short": b"\x0f\x5e\x35\x01\x01",
    }
    settings = bytes([1, 3, 0, 0])  # B 2, T 4, vocab 65536, file order
    settings_vocab = bytes([0, 7, 99, 1])  # B 1, T 8, vocab 100, shuffled
    tokens = list(TEXT)
    c["fuzz_token_shard"] = {
        "text": settings + shard(tokens),
        "text_shuffled_vocab100": settings_vocab + shard([t % 100 for t in tokens]),
        "token_past_vocab": settings_vocab + shard(tokens),
        "too_small": settings + shard(tokens[:5]),
        "empty": settings + shard([]),
        "claims_more": settings + shard(tokens, claimed=1 << 30),
        "claims_fewer": settings + shard(tokens, claimed=3),
        "negative_count": settings + shard(tokens, claimed=-2),
        "bad_version": settings + shard(tokens, version=2),
        "half_token": settings + shard(tokens) + b"\x01",
        "short": settings + b"\x50\x2a\x35\x01",
    }

    def loader(shards, B=2, T=4, world=1, rank=0, shuffle=0, seed=5, vocab=0, pos=(0, 0, 0), reads=20):
        head = bytes([len(shards) - 1, B - 1, T - 1, world - 1, rank, shuffle, seed, vocab, *pos, reads])
        return head + b"".join(struct.pack("<I", len(s)) + s for s in shards)

    a, b = shard(tokens[:40]), shard(tokens[40:])
    c["fuzz_dataloader"] = {
        "one_shard": loader([shard(tokens)]),
        "two_shards": loader([a, b]),
        "two_shards_shuffled": loader([a, b], shuffle=1, reads=40),
        "two_ranks": loader([a, b], world=2, rank=1, B=1, T=8),
        "rank_past_world": loader([a], world=2, rank=2),
        "resume_second_shard": loader([a, b], pos=(3, 1, 2)),
        "resume_past_end": loader([a, b], pos=(0, 2, 0)),
        "resume_past_batches": loader([a, b], pos=(0, 0, 200)),
        "four_shards_vocab": loader([a, b, a, b], vocab=255, shuffle=1),
        "one_bad_shard": loader([a, shard(tokens, claimed=1000)]),
        "short": bytes([1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 5]),
    }
    pieces = [bytes([i]) for i in range(10)] + [b"the", b" king", b"", b"\xe2\x80\x99"]
    c["fuzz_tokenizer"] = {
        "v2": tokenizer_file(pieces, eot=13),
        "v1": tokenizer_file(pieces, version=1),
        "one_token": tokenizer_file([b"\n"], eot=0),
        "eot_outside": tokenizer_file(pieces, eot=14),
        "claims_more": tokenizer_file(pieces, vocab=65536),
        "claims_too_many": tokenizer_file(pieces, vocab=65537),
        "zero_vocab": tokenizer_file([], vocab=0),
        "trailing": tokenizer_file(pieces, eot=1) + b"x",
        "piece_past_end": tokenizer_file(pieces, eot=1)[:-2],
        "version_3": tokenizer_file(pieces, version=3),
        "short": b"\x70\x2a\x35\x01",
    }
    c["fuzz_prepare_data"] = {
        "text": TEXT,
        "utf8": "Ça, c'est là — señor 夜\n".encode(),
        "binary": bytes(range(256)),
        "empty": b"",
        "one_byte": b"a",
        "nineteen_bytes": b"abcdefghijklmnopqrs",
        "twenty_bytes": b"abcdefghijklmnopqrst",
        "nul_bytes": b"\0" * 64,
    }
    args = [
        ["-i", "data/x_train.bin", "-j", "data/x_val.bin", "-b", "4", "-t", "32", "-x", "10", "-v", "5"],
        ["--attn", "knn", "--attn-k", "8", "--attn-index", "block", "--attn-eval", "exact,knn:k=4:index=brute"],
        ["--attn", "knn-tail", "--attn-k", "8", "--attn-tail", "8", "--attn-grad", "sampled", "--attn-grad-samples", "4"],
        ["--attn", "gumbel", "--attn-grad", "sampled", "--attn-gumbel-groups", "3", "--attn-gumbel-samples", "8"],
        ["--attn", "kmv", "--attn-tail", "4", "--attn-kmv-threshold", "relative", "--attn-seed", "7"],
        ["-e", "d12", "--channels", "768", "-t", "1024", "-d", "524288", "-k", "linear", "-q", "0.0"],
        ["-e", "d6", "--layers", "1073741824", "--channels", "1073741824", "--heads", "1"],
        ["-l", "3e-4", "-u", "100", "-c", "0.1", "--beta1", "0.9", "--beta2", "0.99", "--eps", "1e-8", "--grad-clip", "1"],
        ["-o", "log", "-n", "5", "-y", "1", "--shuffle", "1", "--seed", "42", "-z", "1", "-pi", "mpi"],
        ["--eval-only", "1", "-e", "model.bin", "-m", "-1"],
        ["-b", "0"],
        ["-x", "0"],
        ["--attn-eval", "knn:k=x"],
        ["-b", "99999999999999999999"],
        ["--no-such-flag", "1"],
        ["-t"],
        ["-l", "nan"],
    ]
    c["fuzz_train_args"] = {"args_%02d" % i: b"\0".join(a.encode() for a in cmd) for i, cmd in enumerate(args)}
    return c


def main():
    for name, files in corpus().items():
        d = os.path.join(OUT, name)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        for fname, data in files.items():
            with open(os.path.join(d, fname), "wb") as f:
                f.write(data)
        print("%s: %d files" % (d, len(files)))


if __name__ == "__main__":
    main()
