"""What a training run writes next to its weights: the summary (``<out>.json``) and the model
card (``<out>.md``, Markdown), both from the run's summary dict."""

from __future__ import annotations

import json
import math
from pathlib import Path

from collapseguard.io.markdown import md_cell, md_code, md_text
from collapseguard.io.strict_json import json_ready


def _fmt(v) -> str:
    if isinstance(v, float):
        return "n/a" if math.isnan(v) else f"{v:.3f}"
    return md_cell(v)  # family and set names come from folder names and manifests


def table(rows: list[dict], columns: list[str]) -> str:
    """A Markdown table of ``rows`` restricted to ``columns`` (missing cells shown as n/a)."""
    head = "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns) + "\n"
    return head + "".join("| " + " | ".join(_fmt(r.get(c, float("nan"))) for c in columns) + " |\n"
                          for r in rows)


def render_card(summary: dict) -> str:
    """Markdown model card from a training summary (see ``run.run_training``)."""
    d, cfg = summary["data"], summary["config"]
    lines = [
        f"# Model card: {md_text(summary.get('name', 'cnn'))} ({md_text(summary['weights_file'])}, version {summary['version']})",
        "",
        ("Crop-based degradation detector: a small conv net on native-resolution crops, one score per "
         "image, higher = more degraded. Trained with a chain-aware objective (RankNet pairs within a "
         "chain + clean-vs-degraded BCE: step 0 clean, steps 1-2 ranking only, step 3 weight 0.3, "
         "steps >= 4 degraded)."),
        "",
        "## Data",
        (f"- chains: {d['n_chains_train']} train / {d['n_chains_test']} held-out (split by source image, "
         f"{d['n_sources_train']} / {d['n_sources_test']} sources)"),
        f"- families trained on: {', '.join(map(md_text, d['families_train'])) or '(none)'}",
        f"- families excluded: {', '.join(map(md_text, d['families_excluded'])) or '(none)'}",
        f"- steps present: {', '.join(map(str, d['steps']))}",
        (f"- clean negatives: {d['n_clean_train_files']} files x {d['clean_variants']} variants (as-is + "
         "camera-like: sensor grain, JPEG q70-95, mild sharpening, small upscales, web-size downscales, "
         "native-resolution windows of large photos); "
         f"{d['n_clean_heldout_files']} clean files held out"),
        f"- crop bank: {d['crops_per_bank_image']} crops of {cfg['net']['crop_size']} px per image",
        *([f"- damage ladders: {cfg['generic_ladders']} per clean training file (classic distortions at "
            "strength 0.3 / 0.5 / 1.0, trained as steps 3 / 5 / 10 of extra chains)"]
          if cfg.get("generic_ladders") else []),
        *_teacher_lines(summary.get("teacher")),
        "",
        "## Training",
        (f"- iterations {cfg['iterations']}, chains/batch {cfg['chains_per_batch']} x {cfg['steps_per_chain']} "
         f"steps, clean/batch {cfg['clean_per_batch']}, crops/image {cfg['crops_per_image']}, lr {cfg['lr']}, "
         f"seed {cfg['seed']}, threads {cfg['threads']}"),
        (f"- network: width {cfg['net']['width']}, crop {cfg['net']['crop_size']} px, "
         f"{cfg['net']['n_crops']} crops at inference, {summary['n_parameters']} parameters, "
         f"{summary['weights_bytes']} bytes"),
        (f"- wall time: data {summary['seconds_data']:.0f} s, training {summary['seconds_train']:.0f} s"
         + (f" ({summary['seconds_train_this_process']:.0f} s of it in this process, resumed at step "
            f"{summary['resumed_from_step']})" if summary.get("resumed_from_step") else "")
         + f", evaluation {summary['seconds_eval']:.0f} s"),
        f"- final loss {summary['final_loss']:.4f} (first logged {summary['first_loss']:.4f})",
        "",
        "## Held-out metrics (sources never seen in training)",
        "",
    ]
    if summary.get("evaluation") == "not run":  # --no-eval, or a run stopped while evaluating
        lines.append("Not measured: the held-out evaluation did not run (`train --no-eval`, or the "
                     "run was stopped after its weights were written). `collapseguard evaluate "
                     "--chains ... -d cnn:WEIGHTS` measures the weights.")
        return "\n".join(lines)
    au = summary["heldout_auroc"]
    cols = ["family", "n_chains"] + sorted({k for r in au for k in r if k.startswith("auroc")},
                                            key=lambda c: int(c.split("v")[1]))
    lines.append(table(au, cols))
    c = summary["clean"]
    lines += [
        ("Clean false-positive rate at the threshold that drops 95% of held-out step-10 images "
         f"(threshold {_fmt(c['threshold'])}):"),
        "",
        table(c["groups"], ["set", "n", "fpr"]),
    ]
    return "\n".join(lines)


def _teacher_lines(t: dict | None) -> list[str]:
    """The model card's lines on a teacher trained beside the chains (none without one)."""
    if not t:
        return []
    rho = t["heldout_spearman_vs_teacher"]
    return [(f"- teacher {md_code(t['teacher'])} (version {t['teacher_version']}): its ranking of "
             f"{t['n_train']} labelled images is one more training term ({t['n_heldout']} held out by "
             f"picture (copies and re-renderings together); {t['n_not_labelled']} of the images given not labelled: held-out "
             "chain or clean images, copies of them, duplicates, or an excluded family's); "
             "Spearman correlation with it on the held-out ones: "
             + (_fmt(rho) if isinstance(rho, float) and math.isfinite(rho) else "n/a (fewer than 3)"))]


def write_card(summary: dict, path: str | Path) -> Path:
    path = Path(path)
    path.write_text(render_card(summary))
    return path


def write_summary(summary: dict, path: str | Path) -> Path:
    """The run's summary as strict JSON (NaN and infinities written as null)."""
    path = Path(path)
    path.write_text(json.dumps(json_ready(summary), indent=1, allow_nan=False, default=str))
    return path


def render_distill_card(summary: dict) -> str:
    """Markdown model card of a distilled student (see ``distill.run_distillation``)."""
    cfg = summary["config"]
    rho = summary["heldout_spearman_vs_teacher"]
    agreement = (f"Spearman correlation with the teacher on the held-out images: {_fmt(rho)}"
                 if isinstance(rho, float) and math.isfinite(rho) else
                 "Spearman correlation with the teacher: n/a (fewer than 3 held-out images; label "
                 "more images to measure it)")
    return "\n".join([
        f"# Model card: {md_text(summary.get('name', 'cnn'))} ({md_text(summary['weights_file'])}, version {summary['version']})",
        "",
        (f"A student distilled from the judge {md_code(summary['teacher'])} (version "
         f"{summary['teacher_version']}): the crop network learns the teacher's ranking of the "
         "labelled images (soft percentile targets and the teacher's pairwise order), so it "
         "scores as the teacher orders images, at the network's speed. It knows no more of "
         "degradation than the teacher does and only as much of it as the labelled images show."),
        "",
        "## Data",
        (f"- images labelled by the teacher: {summary['n_labelled']} ({summary['n_train']} to train, "
         f"{summary['n_heldout']} held out by picture: copies and re-renderings together)"),
        "",
        "## Training",
        (f"- iterations {cfg['iterations']}, crop {cfg['net']['crop_size']} px, "
         f"{cfg['net']['n_crops']} crops at inference, lr {cfg['lr']}, seed {cfg['seed']}, "
         f"threads {cfg['threads']}"),
        f"- {summary['n_parameters']} parameters, {summary['weights_bytes']} bytes",
        (f"- wall time: labels and data {summary['seconds_labels_and_data']:.0f} s, training "
         f"{summary['seconds_train']:.0f} s"),
        "",
        "## Held-out agreement",
        "",
        agreement,
        "",
    ])
