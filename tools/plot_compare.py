#!/usr/bin/python3
"""tools/plot_compare.py — the plots of build/compare_attention, from its results.json,
and of build/attn_meter, from its JSON.

  /usr/bin/python3 tools/plot_compare.py OUT/results.json OUT
  /usr/bin/python3 tools/plot_compare.py --meter METER.json OUT [NAME]

writes OUT/loss_curves.png (train and val loss per setting: the mean over seeds
and a band of ± one standard deviation; train losses averaged over windows of
steps, as the summary holds them) and OUT/cross_eval.png (the cross-evaluation
heatmap: mean val loss, trained with the row's setting, evaluated with the
column's); where `--attn exact` is one of the settings, OUT/gap_curves.png (each other
setting's val loss minus exact's at the same step of the same seed: the mean over the
seeds that have both, and their range as a band); and for every meter (model, seed) in
results.json, or the one
METER.json, four plots OUT/meter_<name>_*.png (NAME, default "meter"):
  _error.png    relative l2 error of each mode against k, log-log, one panel per
                layer: the mean over the layer's heads of each head's mean over rows
                (band: the heads' range), beside §2.2's bound on knn's error computed
                from the measured top-k mass (dashed), and a reference line of slope -1
                ([P1] Thm 2.5 at fixed m, error ~ n / (k sqrt(m)); its constant is not
                known, so the line is placed through knn-tail's first point and only its
                slope means anything); dotted verticals at k = n^(1/8), n^(1/4), n^(1/2)
  _mass.png     softmax mass of the top-k set against k, every head (mean over rows,
                and the minimum dashed)
  _c.png        assumption A's c per layer and head at the largest T, trained beside
                random init (log scale)
  _c_vs_T.png   c against T per layer and head, trained (solid) and random init (dashed)
Every number comes from what compare_attention or attn_meter wrote; this script only
draws. Needs Debian's python3-matplotlib.
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_curves(training, path):
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, title in ((axes[0], "train_curve", "train loss"), (axes[1], "val_curve", "val loss")):
        for t in training:
            c = t[key]
            if not c["step"]:
                continue
            lo = [m - s for m, s in zip(c["mean"], c["std"])]
            hi = [m + s for m, s in zip(c["mean"], c["std"])]
            (line,) = ax.plot(c["step"], c["mean"], label=t["label"], linewidth=1.2)
            ax.fill_between(c["step"], lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
        window = training[0]["train_curve"].get("window", 1) if key == "train_curve" else 1
        ax.set_title(title + (f" (mean over windows of {window} steps)" if window > 1 else ""))
        ax.set_xlabel("step")
        ax.set_ylabel("loss (nats)")
        ax.grid(alpha=0.3)
    seeds = training[0]["val_loss"]["n"]
    axes[1].legend(fontsize=8)
    fig.suptitle(f"mean over {seeds} seed(s), band: ± one standard deviation")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_gaps(db, path):
    """each setting's val loss minus exact's, step by step, paired by seed; False if no exact run"""
    exact = {r["seed"]: dict(zip(r["val_curve"]["step"], r["val_curve"]["loss"]))
             for r in db["runs"] if r["setting"] == "--attn exact"}
    if not exact:
        return False
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for setting in dict.fromkeys(r["setting"] for r in db["runs"] if r["setting"] != "--attn exact"):
        gaps = {}  # step -> the seeds' gaps
        label = None
        for r in db["runs"]:
            if r["setting"] != setting or r["seed"] not in exact:
                continue
            label = r["label"]
            for step, loss in zip(r["val_curve"]["step"], r["val_curve"]["loss"]):
                if step in exact[r["seed"]]:
                    gaps.setdefault(step, []).append(loss - exact[r["seed"]][step])
        if not gaps:
            continue
        steps = sorted(gaps)
        mean = [sum(gaps[s]) / len(gaps[s]) for s in steps]
        (line,) = ax.plot(steps, mean, label=f"{label} ({max(len(g) for g in gaps.values())} seed(s))", linewidth=1.2)
        ax.fill_between(steps, [min(gaps[s]) for s in steps], [max(gaps[s]) for s in steps], color=line.get_color(),
                        alpha=0.2, linewidth=0)
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel("val loss − exact's (nats)")
    ax.set_title("paired gap to exact attention: mean over seeds, band: their range")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def plot_matrix(summary, path):
    rows = [r["label"] for r in summary["rows"]]
    cols = [c["label"] for c in summary["columns"]]
    cells = [[cell["val_loss"] for cell in line] for line in summary["matrix"]]
    values = [[c["mean"] if c["mean"] is not None else float("nan") for c in line] for line in cells]
    fig, ax = plt.subplots(figsize=(1.6 + 1.5 * len(cols), 1.2 + 0.7 * len(rows)))
    im = ax.imshow(values, cmap="viridis_r", aspect="auto")
    ax.set_xticks(range(len(cols)), cols, rotation=30, ha="right", fontsize=8)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.set_xlabel("evaluated with")
    ax.set_ylabel("trained with")
    for i, line in enumerate(cells):
        for j, c in enumerate(line):
            if c["mean"] is None:
                continue
            text = f"{c['mean']:.4f}" + (f"\n± {c['std']:.4f}" if c["std"] is not None else "")
            r, g, b, _ = im.cmap(im.norm(c["mean"]))
            ink = "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white"
            ax.text(j, i, text, ha="center", va="center", fontsize=7, color=ink)
    fig.colorbar(im, ax=ax, label="val loss")
    ax.set_title("cross-evaluation: val loss")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def positive(ks, values):
    pairs = [(k, v) for k, v in zip(ks, values) if v is not None and v > 0]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def layer_axes(n, width=4.2, height=3.4):
    cols = min(n, 4)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def plot_meter_error(m, path):
    ks = m["k"]
    fig, axes = layer_axes(len(m["layers"]))
    for ax, layer in zip(axes, m["layers"]):
        heads = layer["heads"]
        for mode in m["modes"]:
            per_head = [h["error"][mode]["mean"] for h in heads]
            mean = [None if any(v[i] is None for v in per_head) else sum(v[i] for v in per_head) / len(per_head)
                    for i in range(len(ks))]
            lo = [None if mean[i] is None else min(v[i] for v in per_head) for i in range(len(ks))]
            hi = [None if mean[i] is None else max(v[i] for v in per_head) for i in range(len(ks))]
            x, y = positive(ks, mean)
            if not x:
                continue
            (line,) = ax.plot(x, y, marker="o", markersize=3, label=mode)
            band = [(k, a, b) for k, a, b in zip(ks, lo, hi) if a is not None and a > 0]
            if band:
                ax.fill_between([b[0] for b in band], [b[1] for b in band], [b[2] for b in band],
                                color=line.get_color(), alpha=0.15, linewidth=0)
            if mode == "knn":
                bounds = [h["topk_bound"]["mean"] for h in heads]
                bound = [None if any(b[i] is None for b in bounds) else sum(b[i] for b in bounds) / len(bounds)
                         for i in range(len(ks))]
                bx, by = positive(ks, bound)
                ax.plot(bx, by, linestyle="--", color=line.get_color(), linewidth=1,
                        label="knn: §2.2 bound 2ρ max|v| / |o|")
            if mode == "knn-tail":
                ref = [y[0] * x[0] / k for k in x]
                ax.plot(x, ref, linestyle=":", color="gray", linewidth=1.2,
                        label="slope −1 ([P1] Thm 2.5, constant unknown)")
        for name, k in m["k_roots"].items():
            ax.axvline(k, color="black", alpha=0.25, linestyle=":", linewidth=0.8)
            ax.text(k, 1.0, name, transform=ax.get_xaxis_transform(), fontsize=6, ha="center", va="bottom")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("k")
        ax.set_ylabel("|o − o_exact| / |o_exact|, mean over rows")
        ax.set_title(f"layer {layer['layer']} (mean over {len(heads)} heads, band: their range)", fontsize=9)
        ax.grid(alpha=0.3, which="both")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"attention error against k, T = {m['T']}, {m['windows']} window(s), m = {m['tail']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_meter_mass(m, path):
    ks = m["k"]
    fig, axes = layer_axes(len(m["layers"]))
    for ax, layer in zip(axes, m["layers"]):
        for h in layer["heads"]:
            (line,) = ax.plot(ks, h["topk_mass"]["mean"], marker="o", markersize=3, label=f"head {h['head']}")
            ax.plot(ks, h["topk_mass"]["min"], linestyle="--", color=line.get_color(), linewidth=0.8)
        ax.set_xscale("log")
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("k")
        ax.set_ylabel("top-k softmax mass")
        ax.set_title(f"layer {layer['layer']}: mean over rows (dashed: min)", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"softmax mass of the top-k set, T = {m['T']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_meter_c(m, path):
    labels, trained, random = [], [], []
    for layer in m["layers"]:
        for h in layer["heads"]:
            labels.append(f"L{layer['layer']} H{h['head']}")
            trained.append(h["c"]["kernel"][-1])
            random.append(h["c_random_init"]["kernel"][-1] if "c_random_init" in h else None)
    fig, ax = plt.subplots(figsize=(max(5, 0.45 * len(labels) + 2), 3.8))
    x = range(len(labels))
    ax.bar([i - 0.2 for i in x], [v or 0 for v in trained], width=0.4, label="trained")
    if any(v is not None for v in random):
        ax.bar([i + 0.2 for i in x], [v or 0 for v in random], width=0.4, label="random init")
    ax.set_xticks(list(x), labels, rotation=90 if len(labels) > 16 else 0, fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("c (kernel matrix, causal)")
    ax.set_title(f"assumption A's c per layer and head, T = {m['c_T'][-1]}: mass outside the T largest entries "
                 "/ mass inside", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_meter_c_vs_t(m, path):
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for layer in m["layers"]:
        for h in layer["heads"]:
            (line,) = ax.plot(m["c_T"], h["c"]["kernel"], marker="o", markersize=3,
                              label=f"L{layer['layer']} H{h['head']}")
            if "c_random_init" in h:
                ax.plot(m["c_T"], h["c_random_init"]["kernel"], linestyle="--", color=line.get_color(), linewidth=0.8)
    ts = m["c_T"]
    ax.plot(ts, [(t - 1) / 2 for t in ts], color="black", linestyle=":", linewidth=1,
            label="(T − 1) / 2: uniform rows")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("T")
    ax.set_ylabel("c")
    ax.set_title("c against T: trained (solid), random init (dashed)", fontsize=9)
    ax.legend(fontsize=6, ncol=2)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_meter(m, out, name):
    plot_meter_error(m, f"{out}/meter_{name}_error.png")
    plot_meter_mass(m, f"{out}/meter_{name}_mass.png")
    plot_meter_c(m, f"{out}/meter_{name}_c.png")
    plot_meter_c_vs_t(m, f"{out}/meter_{name}_c_vs_T.png")


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "--meter":
        if len(sys.argv) not in (4, 5):
            sys.exit("usage: plot_compare.py --meter METER_JSON OUT_DIR [NAME]")
        with open(sys.argv[2]) as f:
            meter = json.load(f)
        plot_meter(meter, sys.argv[3], sys.argv[4] if len(sys.argv) == 5 else "meter")
        return
    if len(sys.argv) != 3:
        sys.exit("usage: plot_compare.py RESULTS_JSON OUT_DIR (or --meter METER_JSON OUT_DIR [NAME])")
    with open(sys.argv[1]) as f:
        db = json.load(f)
    summary = db["summary"]
    out = sys.argv[2]
    if summary.get("training"):
        plot_curves(summary["training"], out + "/loss_curves.png")
        plot_gaps(db, out + "/gap_curves.png")
    plot_matrix(summary, out + "/cross_eval.png")
    for m in db.get("meters", []):
        plot_meter(m["result"], out, m["name"])


if __name__ == "__main__":
    main()
