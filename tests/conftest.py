"""Fixtures shared by the test modules (helpers that are plain functions live in *_fixtures.py)."""

import os
import shutil
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync"]


@pytest.fixture()
def clean_wandb_env(monkeypatch, tmp_path):
    for k in list(os.environ):
        if k.startswith("WANDB_") or k.lower() in ("https_proxy", "http_proxy", "all_proxy"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.netrc, no ~/.config/wandb
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "home" / "wandb-config"))


@pytest.fixture()
def chromium() -> str:
    """Debian's chromium, driven by playwright (never a downloaded browser). Missing is a failure, not a skip:
    the README's test command installs it."""
    assert os.path.exists(CHROMIUM) and shutil.which(CHROMIUM), f"{CHROMIUM} is absent: apt-get install chromium"
    return CHROMIUM


@pytest.fixture()
def sample_runs_copy(tmp_path) -> Path:
    """A copy of the bundled sample_runs/, every run ingested (no TB/W&B exports)."""
    from dash_fixtures import copy_and_ingest_sample_runs

    return copy_and_ingest_sample_runs(tmp_path / "runs")


@pytest.fixture()
def switch_threads_often():
    """Switch threads as often as the interpreter can, so races show (restored after the test)."""
    import sys

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium for the module (Debian's; missing is a failure, not a skip)."""
    from playwright.sync_api import sync_playwright

    assert os.path.exists(CHROMIUM), f"{CHROMIUM} is absent: apt-get install chromium"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture()
def closes_recorders(monkeypatch):
    """Close, after the test, every Recorder it built: for tests that leave theirs open (KempnerForge's
    own, a job between two ingests), so that writer threads do not go on into later tests."""
    from kforge_record import Recorder

    made = []
    init = Recorder.__init__

    def remembered(self, *args, **kwargs):
        made.append(self)
        init(self, *args, **kwargs)

    monkeypatch.setattr(Recorder, "__init__", remembered)
    yield
    for rec in made:
        rec.close()
