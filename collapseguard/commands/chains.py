"""``collapseguard chains``: list, make, export and look at replication chains."""

from __future__ import annotations

import os

import click

from collapseguard.commands._common import check_out_dir, check_out_file, quiet_option
from collapseguard.io.terminal import first_of, printable


def _int_list(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {text!r}") from None


def _check_no_manifest(out_dir) -> None:
    """Refuse an --out that already holds a chains manifest: the manifest written would replace
    it, and the chains it lists would be read by no command any more (their images left behind)."""
    from pathlib import Path

    from collapseguard.training_data_tools.manifest import MANIFEST_NAMES

    held = [n for n in MANIFEST_NAMES if (Path(out_dir) / n).exists()]
    if held:
        raise click.ClickException(
            f"--out {out_dir} already holds {held[0]}: writing chains there would replace it and "
            "drop the chains it lists; give another --out, or remove the folder to start afresh")


@click.group()
def chains():
    """Replication chains: list real ones, make simulated ones, export, view."""


@chains.command("ls")
@click.argument("path", type=click.Path(exists=True))
@click.option("--extract-dir", type=click.Path(), default=None,
              help="Where to extract images of a Parquet dataset (default PATH/.collapseguard_extracted).")
@click.option("--one-based/--no-one-based", default=None,
              help="Chains numbered from 1 with no original: renumber, or drop. Default: renumber "
                   "(with a note) when no chain of the set has a step 0, else drop (a set numbered "
                   "from 0 whose chain lost its original).")
@click.option("--manifest-out", type=click.Path(), default=None,
              help="Also write what was found as a manifest (.csv, .tsv or .parquet), in a folder that "
                   "holds every chain image (e.g. inside PATH): a manifest may only name files under "
                   "its own folder.")
def ls_cmd(path, extract_dir, one_based, manifest_out):
    """Show the chains found in PATH: a manifest, a chains folder, or a Banana100 download.

    Prints the inferred layout, chains, families, tasks, steps, image count and every file that
    could not be placed in a chain (with the reason).
    """
    from collapseguard.training_data_tools.loaders import discover_chains
    from collapseguard.training_data_tools.manifest import write_manifest

    if manifest_out and not manifest_out.endswith((".csv", ".tsv", ".parquet")):  # before any work
        raise click.UsageError(f"--manifest-out {manifest_out}: a manifest is .csv, .tsv or .parquet")
    d = discover_chains(path, extract_dir=extract_dir, one_based=one_based)
    # folder, file and family names come from the data: control characters printed escaped
    click.echo("\n".join(printable(line) for line in d.summary().split("\n")))
    if manifest_out:  # refused, unwritten, where the readers would refuse it (outside the chains)
        write_manifest(d.manifest, manifest_out)
        click.echo(f"manifest written to {manifest_out}")


@chains.command("make")
@click.option("--sources", default="bundled,art:24", show_default=True,
              help="Comma-separated: bundled | art:N[:MIN-MAX][:dither=SIGMA|vary] | pixel:N (pixel art) | "
                   "screen:N (screenshots, UI, diagrams, text) | folder:PATH | views:PATH[:SIDE] | "
                   "shards:GLOB | a folder | a .tar. A folder whose name holds a comma is read "
                   "whole when it exists.")
@click.option("--families", default=None,
              help="Comma-separated replicator families (default: all; see `chains families`).")
@click.option("--steps", default=100, show_default=True, type=click.IntRange(min=1), help="Steps per chain.")
@click.option("--keep", default="0,1,2,3,5,10,20,30,50,100", show_default=True,
              help="Steps to write (step 0, the source, is always written).")
@click.option("--repeats", default=1, show_default=True, type=click.IntRange(min=1),
              help="Chains per (source, family), each with freshly drawn parameters.")
@click.option("--out", "-o", "out_dir", required=True, type=click.Path(),
              help="Output folder (one that holds no manifest yet).")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--workers", "-w", default=2, show_default=True, type=click.IntRange(min=1), help="Worker processes.")
@click.option("--max-sources", default=None, type=click.IntRange(min=1),
              help="Use the first N sources, in --sources order: a spec listed after the first N "
                   "sources gives none.")
@quiet_option()
@click.option("--progress/--no-progress", default=True, hidden=True,
              help="Older spelling: --no-progress is --quiet.")
def make_cmd(sources, families, steps, keep, repeats, out_dir, seed, workers, max_sources, quiet,
             progress):
    """Make simulated replication chains: PNGs under OUT/<family>/<chain>/ plus OUT/manifest.csv."""
    import itertools

    from collapseguard.training_data_tools.chains import check_families, make_chains
    from collapseguard.training_data_tools.replicators import (
        missing_families,
        needs_text,
    )
    from collapseguard.training_data_tools.sources import resolve_sources

    fams = [f.strip() for f in families.split(",") if f.strip()] if families else None
    check_families(fams)  # as --keep below: before --out is made
    if fams is None:  # every default family this install can make: say which it cannot
        for f, lacking in missing_families().items():
            click.echo(f"note: family {f} left out: it {needs_text(lacking)}", err=True)
    negative = [k for k in _int_list(keep) or [] if k < 0]
    if negative:  # before --out is made: a refused command leaves no folder behind
        raise click.BadParameter(f"steps are counted from 0: {','.join(map(str, negative))}",
                                 param_hint="--keep")
    check_out_dir(out_dir)
    _check_no_manifest(out_dir)
    beyond = [k for k in _int_list(keep) or [] if k > steps]
    if beyond and click.get_current_context().get_parameter_source("keep").name != "DEFAULT":
        click.echo(f"note: --keep {','.join(map(str, beyond))} lies beyond --steps {steps} and is not "
                   "written", err=True)
    skipped: list[str] = []
    try:
        every = resolve_sources(sources, seed=seed, skipped=skipped)
        src = itertools.islice(every, max_sources) if max_sources else every
        df = make_chains(src, fams, steps=steps, keep=_int_list(keep) or [0], out_dir=out_dir,
                         seed=seed, workers=workers, progress=progress and not quiet,
                         repeats=repeats, skipped=skipped)
        if max_sources and next(every, None) is not None:  # sources were left: say so
            click.echo(f"note: --max-sources {max_sources} used the first {max_sources} sources of "
                       f"--sources {printable(sources)} in order; the rest were left out", err=True)
    except ValueError as e:  # plain ValueErrors of argument checks
        raise click.ClickException(str(e)) from None
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (cli.Terminated)
        click.echo(f"interrupted: the chains finished so far are kept in {printable(str(out_dir))} "
                   "(each with its .chain.json); the same command makes the rest and reuses them",
                   err=True)
        raise
    finally:  # undecodable and too small source images are left out, but never without a word
        # (even when leaving them out leaves nothing to make)
        if skipped:
            click.echo(f"note: skipped {len(skipped)} source image(s) that could not be decoded or "
                       "are too small: "
                       f"{first_of(printable(x) for x in skipped)}", err=True)
    click.echo(f"{df['chain_id'].nunique()} chains, {len(df)} images, families "
               f"{sorted(df['family'].unique())} -> {os.path.join(out_dir, 'manifest.csv')}")


@chains.command("store")
@click.argument("path", type=click.Path(exists=True))
@click.option("--out", "-o", "out_dir", required=True, type=click.Path(),
              help="Output folder (one that holds no manifest yet).")
@click.option("--storages", default="png,jpeg:90:420,jpeg:75:420,webp:80", show_default=True,
              help="Comma-separated: png | jpeg:Q[:420|422|444] | webp:Q | webp:lossless (Q 1-100).")
@click.option("--workers", "-w", default=2, show_default=True, type=click.IntRange(min=1), help="Worker processes.")
def store_cmd(path, out_dir, storages, workers):
    """Write a chain manifest's images once per storage: each chain becomes one chain per storage
    (id CHAIN~TAG, columns storage and stored_from) under OUT/<tag>/, plus OUT/manifest.csv."""
    from collapseguard.training_data_tools.manifest import read_manifest
    from collapseguard.training_data_tools.storage import parse_storages, store_chains

    try:  # before --out is made: a refused command leaves no folder behind
        sts = parse_storages(storages)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--storages") from None
    check_out_dir(out_dir)
    _check_no_manifest(out_dir)
    try:
        df = store_chains(read_manifest(path), sts, out_dir, workers=workers)
    except (ValueError, OSError) as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"{df['chain_id'].nunique()} chains, {len(df)} images in storages "
               f"{', '.join(s.label for s in sts)} -> {os.path.join(out_dir, 'manifest.csv')}")


@chains.command("families")
def families_cmd():
    """List the replicator families."""
    from collapseguard.training_data_tools.replicators import (
        list_families,
        missing_families,
        needs_text,
        replicator_class,
    )

    default = set(list_families())
    for f in list_families(opt_in=True):
        note = "" if f in default else "  (made only when named in --families)"
        click.echo(f"{f:<18} {replicator_class(f).description}{note}")
    for f, lacking in missing_families(opt_in=True).items():  # not installed here
        click.echo(f"{f:<18} (not available here: it {needs_text(lacking)})")


@chains.command("export")
@click.argument("path", type=click.Path(exists=True))
@click.option("--out", "-o", "out_dir", required=True, type=click.Path(), help="Folder for the shards.")
@click.option("--maxcount", default=1000, show_default=True, type=click.IntRange(min=1), help="Samples per shard.")
@click.option("--prefix", default="chains", show_default=True, help="Shard file name prefix.")
@click.option("--shuffle-seed", default=None, type=int, help="Shuffle samples across shards.")
def export_cmd(path, out_dir, maxcount, prefix, shuffle_seed):
    """Write the chains in PATH as WebDataset shards (image bytes + json with chain, family, task,
    step). The image bytes are copied as they are, not decoded: a damaged file travels into the
    shard, where `filter` and `score` report it as a decode_error."""
    from collapseguard.training_data_tools.export import PREFIX_RULE, export_shards

    if not PREFIX_RULE.fullmatch(prefix):  # before --out is made: a refused command leaves no folder
        raise click.BadParameter(f"letters, digits, - or _ only: {prefix!r}", param_hint="--prefix")
    check_out_dir(out_dir)
    notes: list[str] = []
    try:
        paths = export_shards(path, out_dir, maxcount=maxcount, prefix=prefix, shuffle_seed=shuffle_seed,
                              notes=notes)
    except ValueError as e:  # plain ValueErrors of argument checks
        raise click.ClickException(str(e)) from None
    for note in notes:  # file names come from the data
        click.echo(f"note: {printable(note)}", err=True)
    click.echo(f"{len(paths)} shard(s) -> {out_dir}")


@chains.command("sheet")
@click.argument("path", type=click.Path(exists=True))
@click.option("--out", "-o", required=True, type=click.Path(), help="Output PNG.")
@click.option("--crop", default=160, show_default=True, type=click.IntRange(16, 4096),
              help="Crop side in pixels (native resolution).")
@click.option("--steps", default=None, help="Comma-separated steps to show (default: all kept).")
@click.option("--max-chains", default=16, show_default=True, type=click.IntRange(min=1),
              help="Rows (spread over families).")
@click.option("--families", default=None, help="Comma-separated families to show.")
@click.option("--where", type=click.Choice(["detail", "centre"]), default="detail", show_default=True,
              help="Crop where step 0 has the most detail, or at the centre.")
def sheet_cmd(path, out, crop, steps, max_chains, families, where):
    """Contact sheet of the chains in PATH: rows = chains, columns = steps, native-resolution crops."""
    from collapseguard.training_data_tools.sheet import contact_sheet

    fams = [f.strip() for f in families.split(",")] if families else None
    check_out_file(out)
    unreadable: list[str] = []
    try:
        p = contact_sheet(path, out, crop=crop, steps=_int_list(steps), max_chains=max_chains,
                          families=fams, where=where, unreadable=unreadable)
    except ValueError as e:  # plain ValueErrors of argument checks
        raise click.ClickException(str(e)) from None
    click.echo(f"contact sheet -> {p}")
    if unreadable:
        click.echo(f"note: {len(unreadable)} image(s) could not be read, shown as 'unreadable' "
                   f"(e.g. {printable(unreadable[0])})", err=True)
