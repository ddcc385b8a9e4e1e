#!/usr/bin/python3
"""Independent float64 PyTorch reference for the knngpt GPT-2 model.

Builds a tiny randomly initialised GPT-2, writes it as an llm.c-format
checkpoint (fp32 version 3 and bf16 version 5), and writes the expected
forward/backward/AdamW results that the C++ implementation is tested against.

Usage:
    /usr/bin/python3 tests/reference/gpt2_reference.py --out DIR

Runs on CPU with PyTorch >= 1.13; fully deterministic (fixed seed).
See tests/reference/README.md for the file formats.
"""

import argparse
import math
import os
import struct

import numpy as np
import torch
import torch.nn.functional as F

# ---------------------------------------------------------------------------
# configuration
# ---------------------------------------------------------------------------

V = 50      # vocabulary size
VP = 64     # padded vocabulary size (rows V..VP-1 of wte are zero)
MAXT = 16   # maximum sequence length (rows of wpe)
L = 2       # number of transformer blocks
NH = 4      # number of attention heads
C = 32      # channels
B = 3       # batch size
T = 11      # sequence length (deliberately < MAXT)

SEED = 1337
LN_EPS = 1e-5

ADAMW_STEPS = 10
ADAMW_LR = 1e-2
ADAMW_BETAS = (0.9, 0.95)
ADAMW_EPS = 1e-8
ADAMW_WD = 0.1
CLIP_NORM = 1.0

HEADER_MAGIC = 20240326
HEADER_INTS = 256

DTYPE_F32 = 0
DTYPE_I32 = 1
DTYPE_F64 = 2

# Parameter tensors in llm.c checkpoint order. "wte" is kept as (V, C) in
# torch; it is padded to (VP, C) only when written out.
# Entries: (name, shape, kind) with kind in {"matrix", "bias", "lnw", "lnb"}.
PARAM_SPECS = [
    ("wte",      (V, C),             "matrix"),
    ("wpe",      (MAXT, C),          "matrix"),
    ("ln1w",     (L, C),             "lnw"),
    ("ln1b",     (L, C),             "lnb"),
    ("qkvw",     (L, 3 * C, C),      "matrix"),
    ("qkvb",     (L, 3 * C),         "bias"),
    ("attprojw", (L, C, C),          "matrix"),
    ("attprojb", (L, C),             "bias"),
    ("ln2w",     (L, C),             "lnw"),
    ("ln2b",     (L, C),             "lnb"),
    ("fcw",      (L, 4 * C, C),      "matrix"),
    ("fcb",      (L, 4 * C),         "bias"),
    ("fcprojw",  (L, C, 4 * C),      "matrix"),
    ("fcprojb",  (L, C),             "bias"),
    ("lnfw",     (C,),               "lnw"),
    ("lnfb",     (C,),               "lnb"),
]
PARAM_NAMES = [name for name, _, _ in PARAM_SPECS]
# tensors that receive weight decay in the AdamW run
DECAY_NAMES = {"wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw"}


# ---------------------------------------------------------------------------
# initialisation
# ---------------------------------------------------------------------------

def init_params(gen):
    """Draw float32 parameters (a stronger test than GPT-2's own init)."""
    params = {}
    for name, shape, kind in PARAM_SPECS:
        z = torch.randn(shape, generator=gen, dtype=torch.float32)
        if kind == "matrix":
            p = 0.1 * z
        elif kind == "bias":
            p = 0.05 * z
        elif kind == "lnw":
            p = 1.0 + 0.1 * z
        else:  # "lnb"
            p = 0.05 * z
        params[name] = p.contiguous()
    return params


# ---------------------------------------------------------------------------
# model (dtype follows the parameters; used in float64)
# ---------------------------------------------------------------------------

def layernorm(x, w, b):
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)  # biased variance
    return (x - mean) / torch.sqrt(var + LN_EPS) * w + b


def causal_self_attention(x, qkvw, qkvb, nh):
    bsz, t, c = x.shape
    hs = c // nh
    qkv = x @ qkvw.t() + qkvb                    # (B, T, 3C)
    q, k, v = qkv.split(c, dim=-1)               # each (B, T, C)
    # head h uses channels h*hs .. (h+1)*hs-1
    q = q.view(bsz, t, nh, hs).transpose(1, 2)   # (B, NH, T, HS)
    k = k.view(bsz, t, nh, hs).transpose(1, 2)
    v = v.view(bsz, t, nh, hs).transpose(1, 2)
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    scores = scores.masked_fill(~mask, float("-inf"))
    att = torch.softmax(scores, dim=-1)
    y = att @ v                                  # (B, NH, T, HS)
    return y.transpose(1, 2).contiguous().view(bsz, t, c)


def forward(p, inputs, targets):
    """Returns (logits (B,T,V), mean cross-entropy loss)."""
    bsz, t = inputs.shape
    pos = torch.arange(t)
    x = p["wte"][inputs] + p["wpe"][pos]
    for l in range(L):
        h = layernorm(x, p["ln1w"][l], p["ln1b"][l])
        h = causal_self_attention(h, p["qkvw"][l], p["qkvb"][l], NH)
        x = x + (h @ p["attprojw"][l].t() + p["attprojb"][l])
        h = layernorm(x, p["ln2w"][l], p["ln2b"][l])
        h = h @ p["fcw"][l].t() + p["fcb"][l]
        h = F.gelu(h, approximate="tanh")
        x = x + (h @ p["fcprojw"][l].t() + p["fcprojb"][l])
    x = layernorm(x, p["lnfw"], p["lnfb"])
    logits = x @ p["wte"].t()                    # tied head, (B, T, V)
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)),
                           targets.reshape(-1))
    return logits, loss


# ---------------------------------------------------------------------------
# serialisation helpers
# ---------------------------------------------------------------------------

def pad_wte(t):
    """(V, C) -> (VP, C) with zero rows appended."""
    out = torch.zeros((VP,) + tuple(t.shape[1:]), dtype=t.dtype)
    out[: t.shape[0]] = t
    return out


def flat_llmc(p, dtype):
    """All parameters in llm.c order (wte padded) as one flat tensor."""
    parts = []
    for name in PARAM_NAMES:
        t = p[name].detach()
        if name == "wte":
            t = pad_wte(t)
        parts.append(t.to(dtype).reshape(-1))
    return torch.cat(parts)


def header_bytes(version):
    h = [0] * HEADER_INTS
    h[0] = HEADER_MAGIC
    h[1] = version
    h[2] = MAXT
    h[3] = V
    h[4] = L
    h[5] = NH
    h[6] = C
    h[7] = VP
    return struct.pack("<%di" % HEADER_INTS, *h)


def write_checkpoint_f32(path, p32):
    flat = flat_llmc(p32, torch.float32).numpy().astype("<f4")
    with open(path, "wb") as f:
        f.write(header_bytes(3))
        f.write(flat.tobytes())
    return flat.size


def write_checkpoint_bf16(path, p32):
    flat = flat_llmc(p32, torch.float32).to(torch.bfloat16)
    raw = flat.view(torch.int16).numpy().astype("<i2")
    with open(path, "wb") as f:
        f.write(header_bytes(5))
        f.write(raw.tobytes())
    return flat.to(torch.float32)


class RecordWriter:
    def __init__(self, path):
        self.f = open(path, "wb")
        self.names = []

    def add(self, name, tensor, dtype):
        t = tensor.detach().contiguous()
        if dtype == DTYPE_F32:
            arr = t.to(torch.float32).numpy().astype("<f4")
        elif dtype == DTYPE_I32:
            arr = t.to(torch.int32).numpy().astype("<i4")
        elif dtype == DTYPE_F64:
            arr = t.to(torch.float64).numpy().astype("<f8")
        else:
            raise ValueError("bad dtype")
        nb = name.encode("ascii")
        self.f.write(struct.pack("<i", len(nb)))
        self.f.write(nb)
        self.f.write(struct.pack("<ii", dtype, arr.ndim))
        self.f.write(struct.pack("<%di" % arr.ndim, *arr.shape))
        self.f.write(np.ascontiguousarray(arr).tobytes())
        self.names.append((name, dtype, tuple(arr.shape)))

    def close(self):
        self.f.close()


# ---------------------------------------------------------------------------
# AdamW run
# ---------------------------------------------------------------------------

def adamw_run(p32, inputs, targets):
    p = {n: p32[n].to(torch.float64).clone().requires_grad_(True)
         for n in PARAM_NAMES}
    decay = [p[n] for n in PARAM_NAMES if n in DECAY_NAMES]
    no_decay = [p[n] for n in PARAM_NAMES if n not in DECAY_NAMES]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": ADAMW_WD},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=ADAMW_LR, betas=ADAMW_BETAS, eps=ADAMW_EPS)
    all_params = [p[n] for n in PARAM_NAMES]
    losses, norms = [], []
    for _ in range(ADAMW_STEPS):
        opt.zero_grad(set_to_none=True)
        _, loss = forward(p, inputs, targets)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(all_params, CLIP_NORM)
        opt.step()
        losses.append(loss.item())
        norms.append(float(norm))
    return p, losses, norms


# ---------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output directory")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    p32 = init_params(gen)
    inputs = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int64)
    targets = torch.randint(0, V, (B, T), generator=gen, dtype=torch.int64)

    # float64 forward + backward from the float32 weights
    p64 = {n: p32[n].to(torch.float64).clone().requires_grad_(True)
           for n in PARAM_NAMES}
    logits, loss = forward(p64, inputs, targets)
    loss.backward()

    # checkpoints
    model_path = os.path.join(args.out, "model.bin")
    n_params = write_checkpoint_f32(model_path, p32)
    bf16_path = os.path.join(args.out, "model_bf16.bin")
    params_bf16 = write_checkpoint_bf16(bf16_path, p32)

    # AdamW reference
    p_final, ad_losses, ad_norms = adamw_run(p32, inputs, targets)

    # expected tensors
    exp_path = os.path.join(args.out, "expected.bin")
    w = RecordWriter(exp_path)
    w.add("config", torch.tensor([V, VP, MAXT, L, NH, C, B, T]), DTYPE_I32)
    w.add("inputs", inputs, DTYPE_I32)
    w.add("targets", targets, DTYPE_I32)
    w.add("logits", logits, DTYPE_F64)
    w.add("loss", loss.reshape(1), DTYPE_F64)
    for n in PARAM_NAMES:
        g = p64[n].grad
        if n == "wte":
            g = pad_wte(g)
        w.add("grad_" + n, g, DTYPE_F64)
    w.add("params_bf16", params_bf16, DTYPE_F32)
    w.add("adamw_losses", torch.tensor(ad_losses, dtype=torch.float64),
          DTYPE_F64)
    w.add("adamw_grad_norms", torch.tensor(ad_norms, dtype=torch.float64),
          DTYPE_F64)
    w.add("adamw_final_params", flat_llmc(p_final, torch.float32), DTYPE_F32)
    w.close()

    # summary
    print("config: V=%d Vp=%d maxT=%d L=%d NH=%d C=%d B=%d T=%d"
          % (V, VP, MAXT, L, NH, C, B, T))
    print("parameters (padded): %d" % n_params)
    print("wrote %s (fp32, version 3, %d bytes)"
          % (model_path, os.path.getsize(model_path)))
    print("wrote %s (bf16, version 5, %d bytes)"
          % (bf16_path, os.path.getsize(bf16_path)))
    print("wrote %s (%d bytes):" % (exp_path, os.path.getsize(exp_path)))
    for name, dt, shape in w.names:
        print("  %-20s %-7s %s"
              % (name, ["float32", "int32", "float64"][dt], list(shape)))
    print("loss: %.15f" % loss.item())
    print("adamw losses:")
    for i, (l_, n_) in enumerate(zip(ad_losses, ad_norms)):
        print("  step %2d  loss %.12f  grad_norm %.6f%s"
              % (i, l_, n_, "  (clipped)" if n_ > CLIP_NORM else ""))


if __name__ == "__main__":
    main()
