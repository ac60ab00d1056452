"""Train a tiny Llama-style GPT on CPU with DDP (gloo) and record it with kforge_record.

    torchrun --standalone --nproc-per-node 2 examples/train_tiny.py --run-dir runs/demo --ckpt-dir runs/ckpt

Real training, small enough for two CPU cores: a character-level model (RMSNorm, RoPE,
grouped-query attention, SwiGLU MLP) on the public-domain text in examples/data/corpus.txt.
Every rank records its own shard; rank 0 checkpoints every --ckpt-every steps and a relaunch
with the same --run-dir/--ckpt-dir resumes from the last checkpoint (a new attempt in the shards).

Batches are a pure function of (seed, rank, step), so a resumed run sees exactly the data it
would have seen without the interruption, and every run is deterministic from --seed.

Fault injection (documented, off by default), for demo data that has something to find:
  --slow-rank R --slow-ms MS   rank R sleeps MS ms in its data phase every step (a slow loader);
                               the other ranks then wait for it inside the gradient all-reduce
  --stall-from S --stall-ms MS every rank sleeps MS ms in its data phase from step S on (an input
                               pipeline that falls behind on every rank: a data stall, and the
                               step time regresses)
  --spike-step S               lr x --spike-lr-mult for --spike-len steps from step S: a loss spike
  --nan-step N                 rank --nan-rank's loss at step N is multiplied by NaN (a corrupted
                               batch): the all-reduced gradients are NaN on every rank, so every
                               rank skips the optimizer step, as real trainers do, and records the NaN
  --telemetry-every N          every N steps, each rank passes a simulated GPU's readings to end_step
                               as the hw/ columns (this CPU job has no GPU for the recorder's NVML
                               sampler to read; a job's own hw/ values feed the same findings)
  --throttle-rank R --throttle-from S --throttle-to T --throttle-ms MS
                               rank R's simulated GPU throttles (thermal slowdown, SM clock 1,980 ->
                               1,200 MHz) at steps S..T, and its optimizer step takes MS ms longer
                               then (a slower GPU: its own work straggles, the others wait)
"""

from __future__ import annotations

import argparse
import math
import os
import time
from dataclasses import asdict, dataclass
from time import perf_counter

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from kforge_record import Recorder

DEFAULT_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "corpus.txt")


# -----------------------------------------------------------------------------
# config


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    run_dir: str
    ckpt_dir: str
    data: str = DEFAULT_DATA
    seed: int = 1337
    max_steps: int = 250
    batch_size: int = 16  # sequences per rank per step
    seq_len: int = 64
    n_layers: int = 3
    dim: int = 96
    n_heads: int = 4
    n_kv_heads: int = 2
    ffn_hidden_dim: int = 256  # 8/3 * dim, as Llama sizes its SwiGLU
    lr: float = 3e-3
    min_lr_frac: float = 0.1
    warmup_steps: int = 20
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    eval_every: int = 50
    eval_batches: int = 4
    ckpt_every: int = 50
    flush_every: int = 25
    log_every: int = 10
    tags: tuple[str, ...] = ()
    # fault injection
    slow_rank: int | None = None
    slow_ms: float = 0.0
    stall_from: int | None = None
    stall_ms: float = 0.0
    spike_step: int | None = None
    spike_len: int = 2
    spike_lr_mult: float = 50.0
    nan_step: int | None = None
    nan_rank: int = 0
    telemetry_every: int = 0
    throttle_rank: int | None = None
    throttle_from: int = 0
    throttle_to: int = 0
    throttle_ms: float = 0.0

    def __post_init__(self):
        for name in ("max_steps", "batch_size", "seq_len", "n_layers", "dim", "n_heads", "n_kv_heads",
                     "ffn_hidden_dim", "eval_every", "eval_batches", "ckpt_every", "flush_every", "log_every",
                     "spike_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.dim % self.n_heads or self.n_heads % self.n_kv_heads:
            raise ValueError("dim must be divisible by n_heads, and n_heads by n_kv_heads")
        if (self.dim // self.n_heads) % 2:
            raise ValueError("head dim must be even (RoPE rotates pairs)")
        if not (self.lr > 0 and 0 <= self.min_lr_frac <= 1 and self.warmup_steps >= 0 and self.grad_clip > 0):
            raise ValueError("need lr > 0, 0 <= min_lr_frac <= 1, warmup_steps >= 0, grad_clip > 0")
        if self.slow_ms < 0 or (self.slow_ms > 0) != (self.slow_rank is not None):
            raise ValueError("--slow-rank and --slow-ms go together (slow-ms > 0)")
        if self.stall_ms < 0 or (self.stall_ms > 0) != (self.stall_from is not None):
            raise ValueError("--stall-from and --stall-ms go together (stall-ms > 0)")
        if self.spike_lr_mult <= 0:
            raise ValueError("spike_lr_mult must be > 0")
        if self.telemetry_every < 0 or self.throttle_ms < 0 or (self.throttle_rank is not None and not self.telemetry_every):
            raise ValueError("--throttle-rank needs --telemetry-every > 0; telemetry-every and throttle-ms are >= 0")

    def hparams(self) -> dict:
        # Paths are where the run lives, not how it trains: keep them out of the config diff.
        return {k: v for k, v in asdict(self).items() if k not in ("run_dir", "ckpt_dir", "data", "tags")}


# -----------------------------------------------------------------------------
# model: the Llama block shape, so kforge's FLOPs formula (attention + SwiGLU + head) fits exactly


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(seq_len, head_dim, base=10000.0):
    freqs = 1.0 / base ** (torch.arange(0, head_dim, 2).float() / head_dim)
    angles = torch.outer(torch.arange(seq_len).float(), freqs)  # (T, head_dim/2)
    return angles.cos(), angles.sin()


def apply_rope(x, cos, sin):  # x: (B, H, T, head_dim); rotate each (even, odd) pair by its angle
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class Attention(nn.Module):
    def __init__(self, cfg: TrainConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.dim // cfg.n_heads
        self.wq = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(cfg.dim, cfg.dim, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        rep = self.n_heads // self.n_kv_heads  # grouped-query attention: kv heads are shared
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(B, T, -1))


class SwiGLU(nn.Module):
    def __init__(self, cfg: TrainConfig):
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.ffn_hidden_dim, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.ffn_hidden_dim, bias=False)
        self.w2 = nn.Linear(cfg.ffn_hidden_dim, cfg.dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, cfg: TrainConfig):
        super().__init__()
        self.attn_norm, self.attn = RMSNorm(cfg.dim), Attention(cfg)
        self.mlp_norm, self.mlp = RMSNorm(cfg.dim), SwiGLU(cfg)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class TinyGPT(nn.Module):
    def __init__(self, cfg: TrainConfig, vocab_size: int):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, vocab_size, bias=False)
        cos, sin = rope_tables(cfg.seq_len, cfg.dim // cfg.n_heads)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x, self.cos[:T], self.sin[:T])
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


# -----------------------------------------------------------------------------
# data: character-level, batches drawn from a generator seeded by (seed, rank, step)


def load_corpus(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    # Every 10th 256-character block is validation: the corpus mixes texts, and a tail split would
    # hold out one whole text (a different distribution) instead of more of the same.
    blocks = data.split(256)
    val = torch.cat(blocks[9::10])
    train = torch.cat([b for i, b in enumerate(blocks) if i % 10 != 9])
    return train, val, len(chars)


def get_batch(data, *, batch_size, seq_len, seed):
    g = torch.Generator().manual_seed(seed)
    ix = torch.randint(len(data) - seq_len - 1, (batch_size,), generator=g)
    x = torch.stack([data[i:i + seq_len] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + seq_len] for i in ix])
    return x, y


def batch_seed(cfg, rank, step, split):
    # Distinct, stable streams per (seed, rank, step, split); no RNG state to checkpoint.
    return ((cfg.seed * 1_000_003 + rank) * 1_000_003 + step) * 2 + (split == "val")


# -----------------------------------------------------------------------------
# helpers


def lr_at(cfg, step):
    """Linear warmup, cosine decay to min_lr_frac * lr at max_steps; x spike_lr_mult in the spike window."""
    if step <= cfg.warmup_steps:
        lr = cfg.lr * step / cfg.warmup_steps
    else:
        progress = (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps)
        lr = cfg.lr * (cfg.min_lr_frac + (1 - cfg.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * progress)))
    if cfg.spike_step is not None and cfg.spike_step <= step < cfg.spike_step + cfg.spike_len:
        lr *= cfg.spike_lr_mult
    return lr


def measure_matmul_tflops(*, n=256, trials=10, iters=8):
    """This process's fp32 matmul throughput, as a stand-in for a peak-TFLOPS table entry.

    CPUs have no entry in ingest's peak table, so without this MFU would be null. Measured with
    the thread count the training uses; the best of several short trials, because on a shared
    machine a single timing mostly measures the neighbours.
    """
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(3):
        a @ b  # warm up the BLAS kernels
    best = float("inf")
    for _ in range(trials):
        t0 = perf_counter()
        for _ in range(iters):
            a @ b
        best = min(best, perf_counter() - t0)
    return 2 * n**3 * iters / best / 1e12


def throttled(cfg, rank, step):
    return rank == cfg.throttle_rank and cfg.throttle_from <= step <= cfg.throttle_to


def simulated_gpu(cfg, rank, step) -> dict:
    """What NVML would say of this rank's GPU (kforge_record.hw's columns): a busy GPU at its power
    cap and usual clock, or, throttled, a hot one in thermal slowdown at a lower clock."""
    jitter = math.sin(step * 12.9898 + rank * 78.233)  # deterministic, a few MHz and degrees
    if throttled(cfg, rank, step):
        return {"hw/gpu_util_pct": 99.0, "hw/gpu_temp_c": 91.0 + jitter, "hw/gpu_power_w": 520.0 + 5 * jitter,
                "hw/sm_clock_mhz": 1200.0 + 15 * round(jitter), "hw/throttle_reasons": float(0x4 | 0x20 | 0x40)}
    return {"hw/gpu_util_pct": 97.0 + jitter, "hw/gpu_temp_c": 68.0 + 2 * jitter, "hw/gpu_power_w": 690.0 + 10 * jitter,
            "hw/sm_clock_mhz": 1980.0 - 15 * abs(round(jitter)), "hw/throttle_reasons": float(0x4)}


def save_checkpoint(path, *, model, optimizer, step, cfg):
    tmp = path + ".tmp"
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                "config": asdict(cfg)}, tmp)
    os.replace(tmp, path)  # a kill mid-save leaves only the .tmp; the last good checkpoint survives


# -----------------------------------------------------------------------------
# training


def train(cfg: TrainConfig):
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)  # one core per rank: two ranks share a two-core machine
    torch.manual_seed(cfg.seed)  # same init on every rank (DDP broadcasts rank 0's anyway)

    train_data, val_data, vocab_size = load_corpus(cfg.data)
    model = TinyGPT(cfg, vocab_size)
    decay = [p for p in model.parameters() if p.dim() >= 2]  # no weight decay on norm gains
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))

    ckpt_path = os.path.join(cfg.ckpt_dir, os.path.basename(os.path.abspath(cfg.run_dir)), "ckpt.pt")
    start_step = 0
    if os.path.exists(ckpt_path):
        ckpt = torch.load(ckpt_path, map_location="cpu")
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        start_step = ckpt["step"]
    if rank == 0:
        os.makedirs(os.path.dirname(ckpt_path), exist_ok=True)
    ddp = DDP(model)

    # Every rank measures (they contend for the same cores, as in training); all record the max.
    peak = torch.tensor(measure_matmul_tflops())
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)

    rec = Recorder(
        cfg.run_dir,
        model={"n_layers": cfg.n_layers, "dim": cfg.dim, "n_heads": cfg.n_heads, "n_kv_heads": cfg.n_kv_heads,
               "ffn_hidden_dim": cfg.ffn_hidden_dim, "vocab_size": vocab_size, "seq_len": cfg.seq_len},
        hparams=cfg.hparams(),
        tags=list(cfg.tags),
        peak_tflops=peak.item(),
        flush_every_steps=cfg.flush_every,
    )
    # One write per line (end="" and the newline inside): ranks share stdout and must not interleave.
    print(f"rank {rank}/{world} pid {os.getpid()} resumes after step {start_step}, "
          f"matmul peak {peak.item() * 1e3:.1f} GFLOPS\n", end="", flush=True)

    for step in range(start_step + 1, cfg.max_steps + 1):
        rec.start_step()
        lr = lr_at(cfg, step)
        with rec.phase("data"):
            x, y = get_batch(train_data, batch_size=cfg.batch_size, seq_len=cfg.seq_len,
                             seed=batch_seed(cfg, rank, step, "train"))
            if rank == cfg.slow_rank:
                time.sleep(cfg.slow_ms / 1000)
            if cfg.stall_from is not None and step >= cfg.stall_from:
                time.sleep(cfg.stall_ms / 1000)
        with rec.phase("fwd_bwd"):
            loss = ddp(x, y)
            if step == cfg.nan_step and rank == cfg.nan_rank:
                loss = loss * float("nan")
            loss.backward()  # DDP all-reduces (averages) the gradients here
        with rec.phase("optimizer"):
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            # Gradients are identical on every rank after the all-reduce, so all ranks agree to skip.
            if torch.isfinite(grad_norm):
                for group in optimizer.param_groups:
                    group["lr"] = lr
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if throttled(cfg, rank, step):
                time.sleep(cfg.throttle_ms / 1000)
        if step % cfg.ckpt_every == 0 and rank == 0:
            with rec.phase("checkpoint"):
                save_checkpoint(ckpt_path, model=model, optimizer=optimizer, step=step, cfg=cfg)
        hw = simulated_gpu(cfg, rank, step) if cfg.telemetry_every and step % cfg.telemetry_every == 0 else {}
        rec.end_step(step, loss=loss, grad_norm=grad_norm, lr=lr, tokens=x.numel(), **hw)

        if step % cfg.eval_every == 0 or step == cfg.max_steps:
            # Each rank evaluates its own fixed validation batches; ingest averages over ranks.
            model.eval()
            with torch.no_grad():
                losses = [model(*get_batch(val_data, batch_size=cfg.batch_size, seq_len=cfg.seq_len,
                                           seed=batch_seed(cfg, rank, k, "val")))
                          for k in range(cfg.eval_batches)]
            model.train()
            rec.log(step, **{"eval/loss": torch.stack(losses).mean()})
        if rank == 0 and (step % cfg.log_every == 0 or step == cfg.max_steps):
            print(f"step {step} | loss {loss.item():.4f} | lr {lr:.2e} | grad norm {grad_norm.item():.3f}", flush=True)

    rec.close()
    dist.destroy_process_group()


def parse_args(argv=None) -> TrainConfig:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = TrainConfig(run_dir="", ckpt_dir="")
    p.add_argument("--run-dir", required=True, help="kforge run directory (shards go here)")
    p.add_argument("--ckpt-dir", required=True, help="checkpoints go to CKPT_DIR/RUN_NAME/ckpt.pt")
    p.add_argument("--tag", action="append", default=[], dest="tags", help="run tag (repeatable)")
    skip = {"run_dir", "ckpt_dir", "tags"}
    for name, value in asdict(defaults).items():
        if name in skip:
            continue
        typ = {"slow_rank": int, "stall_from": int, "spike_step": int, "nan_step": int,
               "throttle_rank": int}.get(name, type(value))
        p.add_argument("--" + name.replace("_", "-"), type=typ, default=value)
    args = vars(p.parse_args(argv))
    args["tags"] = tuple(args["tags"])
    return TrainConfig(**args)


if __name__ == "__main__":
    train(parse_args())
