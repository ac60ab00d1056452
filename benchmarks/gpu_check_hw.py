"""Does the recorder's GPU telemetry read this GPU through NVML? A short check for a GPU machine
(needs ``pip install 'kforge[gpu]'``: nvidia-ml-py).

A loop of matmuls on the current CUDA device is recorded with ``hw_every_s=0.2`` for a few seconds;
then the part files are read back: each hw/ column should hold values on about one step in
(0.2 s / step time), plausible ones (utilisation 0-100 %, a temperature, a power, an SM clock, a
bitmask), and the device NVML read should be the one CUDA used (its UUID, compared here).

    python benchmarks/gpu_check_hw.py [--seconds 4] [--n 4096]
"""

import argparse
import glob
import sys
import tempfile
import time

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from kforge_record import Recorder
from kforge_record.schema import HW_COLUMNS


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--n", type=int, default=4096)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 2
    import pynvml

    x = torch.randn(args.n, args.n, device="cuda", dtype=torch.bfloat16)
    with tempfile.TemporaryDirectory() as tmp:
        rec = Recorder(f"{tmp}/run", rank=0, world_size=1, hw_every_s=0.2, flush_every_steps=20)
        step, t_end = 0, time.time() + args.seconds
        while time.time() < t_end:
            step += 1
            y = x @ x
            torch.cuda.synchronize()  # steps of real length, so samples fall on a few of them
            rec.end_step(step, loss=y[0, 0])
        rec.close()
        t = pa.concat_tables([pq.read_table(p) for p in sorted(glob.glob(f"{tmp}/run/rank-*/*/part-*.parquet"))],
                             promote_options="default")
    print(f"device: {torch.cuda.get_device_name()}  steps: {step}  rows: {t.num_rows}")
    ok = True
    for c in HW_COLUMNS:
        vals = [v for v in (t[c].to_pylist() if c in t.column_names else []) if v is not None]
        print(f"{c:<22} values: {len(vals):>4}  min {min(vals, default=float('nan')):>10.1f}  max {max(vals, default=float('nan')):>10.1f}")
        ok &= len(vals) >= args.seconds / 0.2 * 0.5
    pynvml.nvmlInit()
    uuid = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "uuid", None)
    if uuid is not None:
        h = pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}" if not str(uuid).startswith("GPU-") else str(uuid))
        print("NVML device by CUDA's UUID:", pynvml.nvmlDeviceGetName(h))
    print("verdict:", "telemetry recorded" if ok else "telemetry missing or sparse")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
