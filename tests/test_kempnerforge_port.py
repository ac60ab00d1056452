"""KempnerForge's own ``TestMetricsTracker`` (its tests/unit/test_observability.py) with only the
tracker's import swapped to kforge's drop-in, run against KempnerForge's stand-in (tests/standins).

Ported verbatim: the tests of the public contract (end_step's return on log and non-log steps,
step 1 always logs, the returned fields and MFU, close without backends, a non-zero rank).
Not ported (docs/frameworks.md says why): test_smoothed_metrics_updated (a private attribute:
kforge's EMAs come from ingest), the init_backends/dispatch/close_with_backends tests (its live
W&B and TensorBoard backends: kforge has none, kforge-ingest exports both), TestStepMetrics
(KempnerForge's own dataclass, which the drop-in returns unchanged).

The names the original imports at module level come from the ``kf_names`` fixture instead, because
the stand-in must be on sys.path only while these tests run.
"""

from __future__ import annotations

import pytest
import torch.distributed as dist
from kempnerforge_fixtures import kempnerforge_fixture  # noqa: F401  (the fixture)

# from kempnerforge.metrics.tracker import MetricsTracker
from kforge_record.integrations.kempnerforge import MetricsTracker

pytestmark = pytest.mark.usefixtures("closes_recorders")  # KempnerForge's tests leave theirs open

JobConfig = MetricsConfig = ModelConfig = StepMetrics = None  # KempnerForge's (the stand-in's), set by kf_names


@pytest.fixture(autouse=True)
def kf_names(kempnerforge, monkeypatch):
    from kempnerforge.metrics.tracker import StepMetrics

    for name, value in {"JobConfig": kempnerforge.JobConfig, "MetricsConfig": kempnerforge.MetricsConfig,
                        "ModelConfig": kempnerforge.ModelConfig, "StepMetrics": StepMetrics}.items():
        monkeypatch.setitem(globals(), name, value)


# ---------------------------------------------------------------------------
# MetricsTracker (KempnerForge's, from here on unchanged)
# ---------------------------------------------------------------------------


class TestMetricsTracker:
    def _make_tracker(self, log_interval: int = 1) -> MetricsTracker:
        config = JobConfig(
            model=ModelConfig(dim=128, n_layers=2, n_heads=2, vocab_size=256),
            metrics=MetricsConfig(log_interval=log_interval),
        )
        return MetricsTracker(config, num_gpus=1)

    def test_end_step_returns_metrics_on_log_step(self):
        tracker = self._make_tracker(log_interval=1)
        tracker.start_step()
        result = tracker.end_step(step=1, loss=2.5, grad_norm=1.0, lr=3e-4, tokens_in_step=1024)
        assert result is not None
        assert isinstance(result, StepMetrics)
        assert result.loss == 2.5

    def test_end_step_returns_none_on_non_log_step(self):
        tracker = self._make_tracker(log_interval=10)
        tracker.start_step()
        result = tracker.end_step(step=3, loss=2.5, grad_norm=1.0, lr=3e-4, tokens_in_step=1024)
        assert result is None

    def test_step_1_always_logs(self):
        tracker = self._make_tracker(log_interval=100)
        tracker.start_step()
        result = tracker.end_step(step=1, loss=2.5, grad_norm=1.0, lr=3e-4, tokens_in_step=1024)
        assert result is not None

    def test_metrics_fields(self):
        tracker = self._make_tracker()
        tracker.start_step()
        result = tracker.end_step(step=1, loss=3.0, grad_norm=0.5, lr=1e-4, tokens_in_step=2048)
        assert result.loss == 3.0
        assert result.grad_norm == 0.5
        assert result.lr == 1e-4
        assert result.tokens_per_sec > 0
        assert result.step_time_sec > 0

    def test_mfu_computed(self):
        tracker = self._make_tracker()
        tracker.start_step()
        result = tracker.end_step(step=1, loss=2.0, grad_norm=1.0, lr=3e-4, tokens_in_step=100000)
        # MFU is computed (may be > 1 in tests due to near-zero step time)
        assert result.mfu > 0.0

    def test_close_without_backends(self):
        tracker = self._make_tracker()
        tracker.close()  # Should not raise

    def test_init_backends_skips_non_rank_zero(self, monkeypatch):
        """Non-rank-0 ranks must not initialize backends even if enabled."""
        monkeypatch.setattr(dist, "is_initialized", lambda: True)
        monkeypatch.setattr(dist, "get_rank", lambda: 1)
        config = JobConfig(
            model=ModelConfig(dim=128, n_layers=2, n_heads=2, vocab_size=256),
            metrics=MetricsConfig(enable_wandb=True),
        )
        # only is_initialized is faked: the recorder asks torch.distributed for the rank, and says it falls back
        with pytest.warns(RuntimeWarning, match="torch.distributed could not give the rank"):
            tracker = MetricsTracker(config, num_gpus=1)
        tracker.init_backends(config)
        assert tracker._backends == []
