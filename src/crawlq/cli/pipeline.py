"""`crawlq reprocess` and `crawlq export`: a pipeline's stored data, run again or written out."""

from __future__ import annotations

from pathlib import Path

import click

from ..pipeline import Pipeline, ReprocessResult
from ..results import FORMATS
from ..results import export as export_records
from .common import load_app, run


def _pipeline(app_spec: str) -> Pipeline:
    return Pipeline.of(load_app(app_spec))


@click.command(short_help="Re-run STAGE and the later ones over stored inputs.")
@click.argument("app_spec", metavar="MODULE:APP")
@click.argument("stage")
@click.option(
    "--where",
    multiple=True,
    metavar="GLOB",
    help="Only the stored inputs whose reference (URL) matches this glob (repeatable).",
)
@click.option(
    "--no-run",
    is_flag=True,
    help="Only schedule: leave the work to running workers (crawlq worker --queue STAGE).",
)
@click.option("-c", "--concurrency", default=100, show_default=True, help="Tasks run at once.")
@click.option(
    "--force",
    is_flag=True,
    help="Run even though workers or another reprocess already serve these queues (they take"
    " part of the work, with the code they loaded). A reprocess killed on another machine"
    " stops counting 30 s after its last heartbeat without it.",
)
def reprocess(
    app_spec: str, stage: str, where: tuple[str, ...], no_run: bool, concurrency: int, force: bool
) -> None:
    """Re-run STAGE of MODULE:APP's pipeline, and the stages after it, over stored inputs.

    Nothing is fetched: the stage reads the raw responses (WARC) or the records the stage
    before it stored. Outputs replace the previous ones (running it twice gives the same
    rows). Then the pipeline's finish step (its report) runs, unless an input failed for
    good: the command then exits with status 1."""
    pipeline = _pipeline(app_spec)

    async def main() -> ReprocessResult:
        try:
            return await pipeline.reprocess(
                stage, where=where, run=not no_run, concurrency=concurrency, force=force
            )
        finally:
            await pipeline.app.aclose()
            pipeline.results.close()

    result = run(main)
    line = f"scheduled {result.scheduled} inputs of {result.stage}"
    if result.worker is not None:
        line += (
            f"; ran {' -> '.join(result.stages)}: {result.worker.done} done,"
            f" {result.worker.failed} failed ({result.worker.dead} dead)"
        )
    click.echo(line)
    if result.worker is not None and not result.finished:
        raise click.ClickException(
            f"{result.worker.dead} input(s) failed for good (crawlq dead list): the finish"
            " step did not run"
        )


@click.command(short_help="Write a record type of the results store: JSONL, CSV, Parquet.")
@click.argument("app_spec", metavar="MODULE:APP")
@click.argument("record_type")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--format",
    "format_",
    type=click.Choice(FORMATS),
    default=None,
    help="Default: from PATH's suffix (.jsonl, .csv, .parquet).",
)
def export(app_spec: str, record_type: str, path: Path, format_: str | None) -> None:
    """Write every RECORD_TYPE record of MODULE:APP's results store to PATH.

    In CSV, text starting with = + - @, a tab or a carriage return is written with a leading '
    (a spreadsheet shows it as text instead of running it as a formula). Lists and dicts are
    JSON in JSON lines, JSON text in CSV and Parquet; booleans are true/false. In Parquet, a
    field holding both text and numbers is a text column."""
    pipeline = _pipeline(app_spec)
    try:
        count = export_records(pipeline.results, record_type, path, format=format_)
    finally:
        pipeline.results.close()
    click.echo(f"wrote {count} {record_type} records to {path}")
