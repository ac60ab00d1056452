"""Train a tiny randomly initialised next-token model with Lightning, recorded by kforge.

    python examples/train_lightning.py --run-dir runs/lightning-demo --steps 20

No download: random integer ids (fixed seed), CPU, seconds. The kforge lines are the callback
and its logger: ``cb = KforgeCallback(...); Trainer(callbacks=[cb], logger=[cb.logger, ...])``.
"""

from __future__ import annotations

import argparse
import os

import lightning.pytorch as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning.pytorch.loggers import CSVLogger

from kforge_record.integrations.lightning import KforgeCallback

VOCAB, DIM = 64, 32


class TinyLM(L.LightningModule):
    def __init__(self, lr: float = 1e-2, seq_len: int = 16):
        super().__init__()
        self.save_hyperparameters()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))
        self.head = nn.Linear(DIM, VOCAB)

    def _loss(self, ids):
        h = self.emb(ids[:, :-1])
        logits = self.head(h + self.mlp(h))
        return F.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1))

    def training_step(self, ids, batch_idx):
        loss = self._loss(ids)
        self.log("train_loss", loss, on_step=True, on_epoch=False)
        return loss

    def validation_step(self, ids, batch_idx):
        self.log("val_loss", self._loss(ids))

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run-dir", required=True)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=16)
    p.add_argument("--val-every", type=int, default=10, help="validate every N batches")
    a = p.parse_args(argv)

    L.seed_everything(0, verbose=False)
    g = torch.Generator().manual_seed(1)
    train = torch.randint(0, VOCAB, (a.steps * a.grad_accum * a.batch_size, a.seq_len), generator=g)
    val = torch.randint(0, VOCAB, (16, a.seq_len), generator=g)
    cb = KforgeCallback(a.run_dir, tags=["lightning-example"])
    csv = CSVLogger(a.run_dir + ".lightning-out", name="csv")  # Lightning's own record, for comparison
    trainer = L.Trainer(
        max_steps=a.steps, accelerator="cpu", devices=1, accumulate_grad_batches=a.grad_accum,
        callbacks=[cb], logger=[cb.logger, csv], log_every_n_steps=1, val_check_interval=a.val_every,
        limit_val_batches=2, num_sanity_val_steps=0, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=False, default_root_dir=a.run_dir + ".lightning-out",
    )
    model = TinyLM(seq_len=a.seq_len)
    trainer.fit(model, torch.utils.data.DataLoader(train, batch_size=a.batch_size),
                torch.utils.data.DataLoader(val, batch_size=8))
    return os.path.join(csv.log_dir, "metrics.csv")


if __name__ == "__main__":
    main()
