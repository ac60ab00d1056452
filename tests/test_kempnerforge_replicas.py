"""The KempnerForge drop-in records the replica parameter checksum (kforge_record.replica) under the name of
each rank's replica group, known from KempnerForge's own config.distributed (docs/diagnosis.md)."""

from __future__ import annotations

import copy

import pytest
import torch
from kempnerforge_fixtures import kempnerforge_fixture  # noqa: F401  (the fixture)

from kforge_dash import ingest_run
from kforge_record.integrations.kempnerforge import MetricsTracker
from kforge_record.integrations.kempnerforge_replicas import NoReplicas, replica_name


def _job(kf, **dist):
    return kf.JobConfig(distributed=kf.DistributedConfig(**dist), metrics=kf.MetricsConfig(log_interval=1))


@pytest.mark.parametrize(("dist", "world", "names"), [
    ({"dp_replicate": 4}, 4, ["param_checksum"] * 4),  # DDP: every rank a replica of every other
    ({"dp_replicate": 4, "tp": 2}, 8, [f"param_checksum/tp{r % 2}" for r in range(8)]),
    ({"dp_replicate": 2, "dp_shard": 2, "pp": 2}, 8,  # mesh pp, dp_replicate, dp_shard (row-major)
     [f"param_checksum/pp{r // 4}-dps{r % 2}" for r in range(8)]),
    ({"dp_replicate": 3}, 6, [f"param_checksum/dps{r % 2}" for r in range(6)]),  # dp_shard -1: 2
])
def test_the_checksum_name_follows_kempnerforges_mesh(kempnerforge, dist, world, names):
    cfg = _job(kempnerforge, **dist)
    assert [replica_name(cfg, r, world) for r in range(world)] == names


@pytest.mark.parametrize(("dist", "why"), [({}, "dp_replicate is 1"), ({"dp_replicate": 2, "cp": 2}, "cp > 1"),
                                           ({"dp_replicate": 3, "tp": 2}, "not a multiple")])
def test_a_layout_without_replicas_says_why(kempnerforge, dist, why):
    with pytest.raises(NoReplicas, match=why):
        replica_name(_job(kempnerforge, **dist), 0, 4)


def test_a_bit_flipped_on_one_replica_is_found_at_its_rank_and_step(kempnerforge, tmp_path):
    run = str(tmp_path / "r")
    cfg = _job(kempnerforge, dp_replicate=4, tp=2)
    torch.manual_seed(0)
    base = torch.nn.Linear(16, 16)
    models = {r: copy.deepcopy(base) for r in range(8)}
    trackers = {r: MetricsTracker(cfg, num_gpus=8, run_dir=run, rank=r, world_size=8, install_sigterm_handler=False)
                for r in range(8)}
    assert all(t.watch_replicas(models[r]) for r, t in trackers.items())
    for step in range(1, 7):
        if step == 4:  # one bit of one weight of rank 5 (tp group 1) flips before step 4 ends
            w = models[5].weight.data.view(torch.int32)
            w[3, 7] ^= 1 << 12
        for r, t in trackers.items():
            t.start_step()
            t.end_step(step, 2.0, 1.0, 3e-4, 1024)
    for t in trackers.values():
        t.close()
    summary = ingest_run(run).summary
    (f,) = [f for f in summary["findings"] if f["kind"] == "replica_divergence"]
    assert f["metric"] == "param_checksum/tp1" and f["ranks"] == [5] and f["first_step"] == 4


def test_plain_fsdp_records_no_checksum_and_says_why(kempnerforge, tmp_path):
    tracker = MetricsTracker(_job(kempnerforge), run_dir=str(tmp_path / "r"), rank=0, world_size=4,
                             install_sigterm_handler=False)
    with pytest.warns(RuntimeWarning, match="no parameter checksum recorded: dp_replicate is 1"):
        assert tracker.watch_replicas(torch.nn.Linear(2, 2)) is False
    tracker.start_step()
    tracker.end_step(1, 2.0, 1.0, 3e-4, 1024)
    tracker.close()
