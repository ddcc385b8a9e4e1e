#!/usr/bin/python3
"""tools/plot_compare.py — the plots of build/compare_attention, from its results.json.

  /usr/bin/python3 tools/plot_compare.py OUT/results.json OUT

writes OUT/loss_curves.png (train and val loss per setting: the mean over seeds
and a band of ± one standard deviation; train losses averaged over windows of
steps, as the summary holds them) and OUT/cross_eval.png (the cross-evaluation
heatmap: mean val loss, trained with the row's setting, evaluated with the
column's). Every number comes from the summary compare_attention wrote; this
script only draws. Needs Debian's python3-matplotlib.
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


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: plot_compare.py RESULTS_JSON OUT_DIR")
    with open(sys.argv[1]) as f:
        summary = json.load(f)["summary"]
    out = sys.argv[2]
    if summary.get("training"):
        plot_curves(summary["training"], out + "/loss_curves.png")
    plot_matrix(summary, out + "/cross_eval.png")


if __name__ == "__main__":
    main()
