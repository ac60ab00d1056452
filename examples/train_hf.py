"""Train a tiny randomly initialised Llama with the Hugging Face Trainer, recorded by kforge.

    python examples/train_hf.py --run-dir runs/hf-demo --steps 20
    torchrun --standalone --nproc-per-node 2 examples/train_hf.py --run-dir runs/hf-ddp

No download: the config is built here and the data are random integer ids (a fixed seed), so it
runs anywhere on CPU in seconds. The one kforge line is ``callbacks=[KforgeCallback(...)]``.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

from kforge_record.integrations.hf import KforgeCallback


class RandomIds(torch.utils.data.Dataset):
    def __init__(self, n: int, seq_len: int, vocab: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, vocab, (n, seq_len), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run-dir", required=True, help="kforge run directory")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=16)
    p.add_argument("--eval-steps", type=int, default=10)
    p.add_argument("--log-history", help="also write trainer.state.log_history here (JSON), for comparison")
    a = p.parse_args(argv)

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=a.seq_len)
    model = LlamaForCausalLM(cfg)
    out = os.path.join(a.run_dir + ".hf-out")
    args = TrainingArguments(
        output_dir=out, max_steps=a.steps, per_device_train_batch_size=a.batch_size,
        gradient_accumulation_steps=a.grad_accum, learning_rate=1e-3, lr_scheduler_type="linear", warmup_steps=3,
        logging_steps=1, eval_strategy="steps", eval_steps=a.eval_steps, per_device_eval_batch_size=8,
        save_strategy="no", report_to="none", use_cpu=True, dataloader_num_workers=0, seed=0,
        include_num_input_tokens_seen="all", disable_tqdm=True,
    )
    trainer = Trainer(
        model=model, args=args,
        train_dataset=RandomIds(a.steps * a.batch_size * a.grad_accum * 2, a.seq_len, cfg.vocab_size, seed=1),
        eval_dataset=RandomIds(16, a.seq_len, cfg.vocab_size, seed=2),
        callbacks=[KforgeCallback(a.run_dir, seq_len=a.seq_len, tags=["hf-example"])],
    )
    trainer.train()
    if a.log_history and args.process_index == 0:
        with open(a.log_history, "w") as f:
            json.dump(trainer.state.log_history, f)


if __name__ == "__main__":
    main()
