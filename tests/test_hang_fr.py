"""kforge-hang and its library (ingest/flight_recorder.py): the ranks a hung job waits for, from flight-recorder dumps.

Real dumps: NVIDIA's four 16-rank Megatron hangs with the faulted ranks known (tests/data/fr_traces/NOTICE.md),
and gloo dumps of torch 2.13 on CPU (tests/data/fr_gloo/, written by tests/make_fr_gloo.py).
"""

import copy
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from kforge_dash.cli.hang import main as hang_main
from kforge_dash.ingest.flight_recorder import analyze_fr, read_fr_dumps
from kforge_dash.text import rank_runs

DATA = Path(__file__).parent / "data"
NVIDIA = DATA / "fr_traces"
GLOO = DATA / "fr_gloo"
FAULTED = {"gpu_error_1st": (12, 14), "gpu_error_2nd": (9, 14), "lock_gil_1st": (9, 14), "lock_gil_2nd": (10, 15)}
GLOO_CASES = {"missing_world": (2,), "missing_subgroup": (3,), "json_missing_world": (2,)}  # order_cycle: below


def faulted_in_log(case: str) -> tuple[int, ...]:
    """The ranks fault_injection.log names (the ground truth beside the dumps)."""
    line = (NVIDIA / case / "fault_injection.log").read_text().splitlines()[0]
    return tuple(json.loads(line.split(":", 1)[1]))


def dumps_of(folder: Path) -> dict[int, dict]:
    dumps, warnings = read_fr_dumps(p for p in folder.iterdir() if p.name != "fault_injection.log")
    assert warnings == []
    return dumps


@pytest.mark.parametrize("case", sorted(FAULTED))
def test_nvidia_cases_name_exactly_the_faulted_ranks(case):
    assert FAULTED[case] == faulted_in_log(case)
    v = analyze_fr(dumps_of(NVIDIA / case))
    assert v.ranks == faulted_in_log(case)
    assert v.ranks_without_dump == () and v.world_size == 16
    assert set(v.waiting) == set(range(16)) - set(v.ranks)  # the majority: every other rank waits
    assert v.desync == []  # all_to_all sizes differ by design (MoE token counts): no desync
    assert v.collective is not None and set(v.collective.group_ranks) & set(v.ranks)
    for r in v.ranks:
        assert f"rank {r}" in v.reason.lower() or rank_runs(v.ranks) in v.reason


def test_how_the_faulted_ranks_are_told():
    """GPU errors: stuck in a collective that a peer completed; a held GIL: nothing pending, never issued."""
    v = analyze_fr(dumps_of(NVIDIA / "gpu_error_1st"))
    assert v.stuck == (12, 14) and v.idle == ()
    assert "rank 13 completed" in v.reason and "rank 15 completed" in v.reason
    c = v.collective  # ranks 13 and 15 wait in the expert all_to_all that rank 12 never issued
    assert (c.group, c.seq, c.op, c.desc, c.group_ranks) == ("74", 20537, "all_to_all", "EXPERT_MODEL_PARALLEL_GROUP",
                                                              (12, 13, 14, 15))
    assert c.waiting == (13, 15) and c.sizes == [[4027, 5120]] and c.dtypes == ["BFloat16"]
    v = analyze_fr(dumps_of(NVIDIA / "lock_gil_2nd"))
    assert v.idle == (10, 15) and v.stuck == ()
    assert "Rank 10 never issued all_to_all #20947 of EXPERT_MODEL_PARALLEL_GROUP 73 (ranks 8–11), which ranks 8, 9, 11" \
        in v.reason


@pytest.mark.parametrize("case", sorted(FAULTED))
def test_a_missing_dump_gives_a_subset_never_a_wrong_rank(case):
    dumps = dumps_of(NVIDIA / case)
    for drop in [*[(r,) for r in range(16)], FAULTED[case]]:
        v = analyze_fr({r: d for r, d in dumps.items() if r not in drop}, world_size=16)
        assert set(v.ranks) <= set(FAULTED[case]), (drop, v.ranks)
        assert v.ranks_without_dump == tuple(sorted(drop))
        if set(drop) & set(FAULTED[case]):
            assert v.ranks == tuple(r for r in FAULTED[case] if r not in drop)
            assert "no evidence from" in v.reason and rank_runs([r for r in drop]) in v.reason
        else:  # a non-faulted rank's dump may be the one evidence of a faulted rank (its TP peer completed more)
            assert v.ranks, drop


@pytest.mark.parametrize("case", sorted(GLOO_CASES))
def test_gloo_dumps_name_the_rank_that_did_not_join(case):
    dumps = dumps_of(GLOO / case)
    assert all(d["version"].startswith("2.") and d["pg_config"].get("", {}).get("name") == "" for d in dumps.values())
    v = analyze_fr(dumps)
    assert v.ranks == GLOO_CASES[case] and v.idle == GLOO_CASES[case]
    assert v.collective.op == "all_reduce" and v.collective.group_ranks == tuple(range(len(dumps)))
    assert v.ranks_without_dump == () and v.desync == []


def test_gloo_subgroup_members_are_inferred_without_pg_config():
    v = analyze_fr(dumps_of(GLOO / "missing_subgroup"))
    assert v.waiting == (0, 1, 2)  # rank 2 waits in its group [2, 3]: gloo's dump names no member; the mentions do
    assert "never issued all_reduce #2 of default_pg 0 (ranks 0–3), which ranks 0, 1 wait in (and 1 more)" in v.reason


def test_gloo_collectives_in_opposite_orders_name_no_rank():
    """Rank 0 waits in the world all_reduce rank 1 never issued; rank 1 in a group its dump alone names."""
    v = analyze_fr(dumps_of(GLOO / "order_cycle"))
    assert v.ranks == () and v.undecided == (1,) and v.waiting == (0, 1)
    assert v.collective.op == "all_reduce" and v.collective.desc == "default_pg" and v.collective.waiting == (0,)
    assert "Rank 1 waits in all_reduce #1 of group 1, whose other members no dump names" in v.reason


def _two_groups(last: dict, head: tuple[str, int]) -> dict:
    """A rank's dump with groups A (pg_id 0) and B (pg_id 1) of ranks 0, 1: last[g] = (enqueued, completed)."""
    entries = []
    for pg_id, g in enumerate("AB"):
        for seq in range(1, last[g][1] + 1):
            entries.append((pg_id, g, seq, "completed"))
    entries.append(({"A": 0, "B": 1}[head[0]], head[0], head[1], "scheduled"))
    d = _dump([(seq, state) for _, _, seq, state in entries], (0, -1, 0))
    for e, (pg_id, g, _, _) in zip(d["entries"], entries):
        e.update(pg_id=pg_id, process_group=(g, "X"))
    d["pg_config"] = {g: {"name": g, "desc": "X", "ranks": "[0, 1]"} for g in "AB"}
    d["pg_status"] = {str(i): {"last_enqueued_collective": last[g][0], "last_completed_collective": last[g][1]}
                      for i, g in enumerate("AB")}
    return d


def test_a_cycle_of_waits_names_no_rank():
    """Rank 0 waits in A's #5 that rank 1 never issued, rank 1 in B's #3 that rank 0 never issued (collectives
    called in different orders on different ranks): a cycle; no rank is named."""
    r0 = _two_groups({"A": (5, 4), "B": (2, 2)}, ("A", 5))
    r1 = _two_groups({"A": (4, 4), "B": (3, 2)}, ("B", 3))
    v = analyze_fr({0: r0, 1: r1})
    assert v.ranks == () and v.undecided == (0, 1) and v.waiting == (0, 1)
    assert "Ranks 0, 1 wait on each other in a cycle" in v.reason
    r1 = _two_groups({"A": (4, 4), "B": (3, 1)}, ("B", 2))  # B's #2, which rank 0 completed: rank 1 is stuck
    r1["entries"].insert(-1, {**r1["entries"][-1], "collective_seq_id": 3, "record_id": 99})
    v = analyze_fr({0: r0, 1: r1})
    assert v.ranks == (1,) and v.stuck == (1,) and v.waiting == (0,)
    assert v.reason.startswith("Rank 1 never saw all_reduce #2 of X B (ranks 0, 1) complete, which rank 0 completed")


def test_pytorch_analyzer_fails_on_gloo_dumps():
    """What kforge-hang is for: PyTorch's own analyzer raises KeyError on these dumps (torch 2.13)."""
    run = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", ".", "-p", "rank_"],
                         cwd=GLOO / "missing_world", capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "KeyError" in run.stderr
    assert analyze_fr(dumps_of(GLOO / "missing_world")).ranks == (2,)


@pytest.mark.slow
def test_live_gloo_job_dumps_are_read(tmp_path):
    """A fresh 3-process gloo job (tests/make_fr_gloo.py): what torch writes today is still read, rank 2 named."""
    import make_fr_gloo  # noqa: I001 (tests/ is on sys.path: a script beside this test)

    folder = make_fr_gloo.write_case("missing_world", tmp_path)
    raw = (folder / "rank_0").read_bytes()
    assert isinstance(pickle.loads(raw), dict)  # _dump_fr_trace returns a pickle's bytes
    dumps, warnings = read_fr_dumps(folder.iterdir())
    assert warnings == [] and sorted(dumps) == [0, 1, 2]
    assert analyze_fr(dumps).ranks == (2,)


def test_nccl_dumps_as_json_give_the_same_verdict(tmp_path):
    """An NCCL job's dumps as torch's _dump_nccl_trace_json writes them: lists for tuples, pg_status numbers as text."""
    for r, d in dumps_of(NVIDIA / "gpu_error_1st").items():
        d = {**d, "pg_status": {k: {f: str(n) for f, n in st.items()} for k, st in d["pg_status"].items()}}
        (tmp_path / f"nccl_trace_rank_{r}.json").write_text(json.dumps(d))
    dumps, warnings = read_fr_dumps(tmp_path.iterdir())
    assert warnings == [] and isinstance(dumps[0]["entries"][0]["process_group"], list)
    v = analyze_fr(dumps)
    assert v.ranks == (12, 14) and v.stuck == (12, 14)
    lagging = {0: _dump([(4, "scheduled"), (5, "scheduled")], (5, -1, 4)), 1: _dump([(4, "completed")], (4, -1, 4))}
    for d in lagging.values():  # the watchdog's count, as text, is what says #4 completed on rank 0
        d["pg_status"] = {k: {f: str(n) for f, n in st.items()} for k, st in d["pg_status"].items()}
    assert analyze_fr({r: json.loads(json.dumps(d)) for r, d in lagging.items()}).ranks == (1,)


def test_desync_is_found_where_ranks_issued_different_collectives(tmp_path):
    dumps = copy.deepcopy(dumps_of(NVIDIA / "lock_gil_1st"))
    e = next(e for e in dumps[10]["entries"] if e["process_group"][0] == "72" and e["collective_seq_id"] == 45265)
    e["input_dtypes"] = ["Float"]
    tp = next(e for e in dumps[12]["entries"] if e["process_group"][0] == "38" and e["collective_seq_id"] == 88684)
    tp["input_sizes"] = [[1, 2]]  # an all_gather's sizes must agree
    v = analyze_fr(dumps)
    assert [(d["group"], d["seq"]) for d in v.desync] == [("38", 88684), ("72", 45265)]
    assert v.desync[1]["desc"] == "EXPERT_MODEL_PARALLEL_GROUP"
    assert v.desync[1]["variants"] == [
        {"ranks": [8, 11, 12, 13, 15], "op": "all_to_all", "sizes": [[2048, 5120]], "dtypes": ["BFloat16"]},
        {"ranks": [10], "op": "all_to_all", "sizes": [[2048, 5120]], "dtypes": ["Float"]}]
    assert v.desync[0]["variants"][1]["ranks"] == [12]
    assert v.ranks == (9, 14)  # the verdict stands


def _dump(entries, status, ranks=(0, 1)):
    return {"version": "2.9", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(ranks))}},
            "pg_status": {"0": dict(zip(("last_enqueued_collective", "last_started_collective", "last_completed_collective"),
                                        status))},
            "entries": [{"record_id": i, "pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": s,
                         "p2p_seq_id": 0, "is_p2p": False, "profiling_name": "nccl:all_reduce", "state": st,
                         "input_sizes": [[4]], "output_sizes": [[4]], "input_dtypes": ["Float"], "output_dtypes": ["Float"],
                         "time_created_ns": 10 + i, "retired": False} for i, (s, st) in enumerate(entries)]}


def test_split_groups_sharing_a_name_are_told_apart():
    """torch's split_group gives disjoint groups one name: [0, 1] and [2, 3] both '0', each with its own sequence."""
    a = [_dump([(5, "scheduled")], (5, -1, 4), ranks=(0, 1)) for _ in range(2)]
    b = [_dump([(5, "scheduled")], (5, -1, 4), ranks=(2, 3)), _dump([], (4, -1, 4), ranks=(2, 3))]
    b[0]["entries"][0]["input_sizes"] = [[8]]  # another shape than group [0, 1]'s #5: no desync between the two
    v = analyze_fr({0: a[0], 1: a[1], 2: b[0], 3: b[1]})
    assert v.desync == [] and v.ranks == (3,) and v.undecided == (0, 1)
    assert v.collective.group_ranks == (2, 3) and v.collective.waiting == (2,)


def test_ranks_stalled_together_are_not_named():
    """Both issued all_reduce #5 and neither completed it: the dumps cannot tell which rank stalled."""
    d = _dump([(5, "scheduled")], (5, -1, 4))
    v = analyze_fr({0: d, 1: copy.deepcopy(d)})
    assert v.ranks == () and v.undecided == (0, 1)
    assert "cannot tell which rank stalled" in v.reason


def test_an_entry_the_watchdog_counted_as_completed_is_not_waited_in():
    """NCCL's state can lag its pg_status: #4 still 'scheduled' though last_completed_collective is 4."""
    v = analyze_fr({0: _dump([(4, "scheduled"), (5, "scheduled")], (5, -1, 4)), 1: _dump([(4, "completed")], (4, -1, 4))})
    assert v.ranks == (1,) and v.idle == (1,) and v.collective.seq == 5  # not rank 0 "stuck" in #4


def test_no_hang_names_no_rank():
    d = _dump([(4, "completed"), (5, "completed")], (5, -1, 5))
    v = analyze_fr({0: d, 1: copy.deepcopy(d)})
    assert v.ranks == () and v.collective is None and v.waiting == ()
    assert v.reason.startswith("No rank with a dump waits in a collective")
    v = analyze_fr({"x": d, 1: copy.deepcopy(d)})  # a key that is no rank number: left out, said so
    assert v.ranks_without_dump == (0,) and v.warnings[0].startswith("rank x: its dump could not be used")
    assert v.reason.endswith("; no dump from rank 0.")


def test_a_bad_file_is_skipped_with_a_warning_naming_it(tmp_path):
    marker = tmp_path / "executed"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    good = pickle.dumps(_dump([(5, "scheduled")], (5, -1, 4)))
    (tmp_path / "rank_0").write_bytes(good)
    (tmp_path / "rank_1").write_bytes(pickle.dumps({"version": "2.9", "entries": [Evil()]}))
    (tmp_path / "rank_2").write_bytes(good[:40])  # truncated
    (tmp_path / "rank_3").write_bytes(pickle.dumps({"version": "3.0", "entries": []}))
    (tmp_path / "rank_4.json").write_text("{not json")
    (tmp_path / "notes").write_text("x")
    (tmp_path / "rank_5").symlink_to(tmp_path / "rank_0")
    (tmp_path / "rank_6").mkdir()
    os.mkfifo(tmp_path / "rank_7")  # opened, it would block the reader
    dumps, warnings = read_fr_dumps(tmp_path.iterdir())
    assert sorted(dumps) == [0] and not marker.exists()
    text = "\n".join(warnings)
    for name, why in [("rank_1", "refused io.open"), ("rank_2", "cannot read it"), ("rank_3", "'3.0' is not supported"),
                      ("rank_4.json", "cannot read it"), ("notes", "does not end with a rank number"),
                      ("rank_5", "not a regular file"), ("rank_6", "not a regular file"), ("rank_7", "not a regular file")]:
        assert any(w.startswith(f"{tmp_path / name}: skipped") and why in w for w in warnings), (name, text)


def test_mangled_dumps_never_raise():
    """Any field of a real dump replaced by a value of another type: a verdict (maybe with warnings), no exception."""
    import random

    base = dumps_of(GLOO / "missing_subgroup")
    odd = [None, 1, -5, "x", "", [], {}, [1, 2], {"a": 1}, ("0",), 3.5, True, "[0, 1]", "[", [None], float("nan"), "-3"]
    rnd = random.Random(3)
    for _ in range(300):
        dumps = copy.deepcopy(base)
        d = dumps[rnd.randrange(4)]
        target = rnd.choice([d, d["pg_status"], *[e for e in d["entries"]], *[v for v in d["pg_status"].values()]])
        target[rnd.choice(list(target) or ["x"])] = rnd.choice(odd)
        v = analyze_fr(dumps)
        assert isinstance(v.reason, str) and set(v.ranks) <= {0, 1, 2, 3}


def test_a_malformed_entry_is_left_out_with_a_warning():
    d = _dump([(5, "scheduled")], (5, -1, 4))
    d["entries"].append({"record_id": 9, "profiling_name": "nccl:all_reduce"})  # no collective_seq_id
    v = analyze_fr({0: d, 1: _dump([], (4, -1, 4))})
    assert v.ranks == (1,) and v.warnings == ("rank 0: 1 of 2 entries could not be read and were left out",)


def test_names_from_disk_are_plain_text():
    d = _dump([(5, "scheduled")], (5, -1, 4))
    d["pg_config"]["0"]["desc"] = "TP\x1b[31m"
    d["entries"][0]["process_group"] = ("0", "TP\x1b[31m")
    v = analyze_fr({0: d, 1: _dump([], (4, -1, 4))})
    assert v.collective.desc == "TP?[31m" and "\x1b" not in v.reason


# --- the CLI -------------------------------------------------------------------------------------


def test_cli_human_output():
    res = CliRunner().invoke(hang_main, [str(NVIDIA / "lock_gil_1st")])
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert "16 dumps (format 2.9), world size 16" in out
    assert "Cause: ranks 9, 14" in out
    assert "The others wait in: all_to_all #45265 of EXPERT_MODEL_PARALLEL_GROUP 72 (ranks 8–15)" in out
    assert "Waiting (the majority): 14 ranks: 0–8, 10–13, 15" in out
    assert "  6 ranks (8, 10–13, 15) in all_to_all #45265 of EXPERT_MODEL_PARALLEL_GROUP 72, for 9, 14" in out
    assert "  8 ranks (0–7) in send 0->1 #14147 of PIPELINE_MODEL_PARALLEL_GROUP (8 groups), for 8–15" in out
    assert "Nothing pending (stuck outside communication): 9, 14" in out
    assert "Ranks without a dump: none" in out and "Desync: none" in out
    assert "fault_injection.log" not in res.output  # not named for a rank: not a dump, not read


def test_cli_json_and_ranks_without_dump(tmp_path):
    for p in (NVIDIA / "gpu_error_2nd").iterdir():
        if p.name != "_dump_14":
            (tmp_path / p.name).write_bytes(p.read_bytes())
    res = CliRunner().invoke(hang_main, [str(tmp_path), "--json", "--world-size", "16"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["ranks"] == [9] and out["ranks_without_dump"] == [14] and out["stuck"] == [9]
    assert out["collective"]["group"] == "72" and out["collective"]["op"] == "all_to_all" and out["dumps"] == 15
    assert out["desync"] == [] and "no dump from rank 14" in out["reason"]
    stuck = next(g for g in out["wait_groups"] if g["ranks"] == [9])
    assert stuck["completed_by"] == [8, 10, 11] and stuck["op"] == "_all_gather_base" and stuck["seq"] == 87749
    moe = out["wait_groups"][0]  # the largest group first: the expert all_to_all, waiting for rank 9
    assert moe["ranks"] == [8, 10, 11, 12, 13, 15] and moe["waits_for"] == [9] and moe["group"] == "72"


def test_cli_gloo_json():
    res = CliRunner().invoke(hang_main, [str(GLOO / "json_missing_world"), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["ranks"] == [2] and json.loads(res.stdout)["versions"] == "2.10"


def test_cli_exit_status(tmp_path):
    (tmp_path / "rank_0").write_bytes(b"\x80\x04garbage")
    res = CliRunner().invoke(hang_main, [str(tmp_path)])
    assert res.exit_code == 1
    assert f"{tmp_path / 'rank_0'}: skipped" in res.stderr and "no readable flight-recorder dump" in res.stderr
    assert CliRunner().invoke(hang_main, [str(tmp_path / "absent")]).exit_code == 2
    assert CliRunner().invoke(hang_main, [str(tmp_path), "--world-size", "0"]).exit_code == 2


def test_console_script_is_declared():
    text = (Path(__file__).parent.parent / "pyproject.toml").read_text()
    assert 'kforge-hang = "kforge_dash.cli.hang:main"' in text
    assert os.access(Path(__file__).parent / "make_fr_gloo.py", os.R_OK)
