"""`kforge-dash [RUNS_ROOT | RUN_DIR] [--host 127.0.0.1] [--port 8501]`: start the Streamlit app."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import click

from kforge_dash.browse.runs import ONLY_RUN_ENV, ROOT_ENV, default_runs_root, is_run_folder
from kforge_dash.cli.options import version_option

APP = Path(__file__).resolve().parent.parent / "browse" / "app.py"


def streamlit_args(*, host: str, port: int) -> list[str]:
    """`streamlit run` arguments: headless, no usage statistics, no file watcher, and the viewer's
    toolbar (toolbarMode minimal: no Deploy button, no developer menu)."""
    return [
        "run", str(APP),
        "--server.address", host, "--server.port", str(port),
        "--server.headless", "true", "--browser.gatherUsageStats", "false",
        "--server.fileWatcherType", "none", "--global.developmentMode", "false",
        "--client.toolbarMode", "minimal",
    ]


def port_taken(host: str, port: int) -> str | None:
    """Why ``port`` cannot be bound on ``host`` (another server on it), or None when it is free."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Tornado binds: a TIME_WAIT port is free
            s.bind((host, port))
    except OSError as e:
        return e.strerror or str(e)
    return None


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("runs_root", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind; the default keeps the app on this machine.")
@click.option("--port", default=8501, show_default=True, type=click.IntRange(1, 65535))
@version_option("kforge-dash")
def main(runs_root: Path | None, host: str, port: int) -> None:
    """Browse the ingested runs under RUNS_ROOT (default: the bundled sample_runs/), or the one run RUN_DIR
    (a run folder, as kforge-ingest and kforge-report take it)."""
    root = (runs_root or default_runs_root()).resolve()
    if not root.is_dir():
        raise click.BadParameter(f"{root} is not a directory", param_hint="RUNS_ROOT")
    only = None
    if is_run_folder(root):  # one run: its folder is the root's one run
        root, only = root.parent, root.name
    busy = port_taken(host, port)
    if busy is not None:  # before saying "serving on": Streamlit would say it after us, and exit
        raise click.UsageError(f"port {port} on {host} is not available ({busy}); pick another with --port")
    # The root travels in the environment, never through a shell or the script's argv parsing.
    os.environ[ROOT_ENV] = str(root)
    if only is None:
        os.environ.pop(ONLY_RUN_ENV, None)
    else:
        os.environ[ONLY_RUN_ENV] = only
    what = f"run {root / only}" if only else f"runs root {root}"
    click.echo(f"kforge-dash: {what}, serving on http://{host}:{port}", err=True)
    from streamlit.web import cli as streamlit_cli

    # The page scripts live in views/, not pages/: a pages/ folder beside app.py would switch
    # Streamlit to its legacy file-based multipage mode instead of app.py's st.navigation.
    # In-process rather than a child process: signals sent to kforge-dash reach the server.
    streamlit_cli.main(args=streamlit_args(host=host, port=port), prog_name="streamlit")

if __name__ == "__main__":
    main()
