"""KempnerForge's config sections as documented: the fields the drop-in reads, with their defaults."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ModelConfig:
    dim: int = 4096
    n_layers: int = 32
    n_heads: int = 32
    n_kv_heads: int | None = None  # None: as many as n_heads
    vocab_size: int = 32000
    ffn_dim_multiplier: float = 1.0
    ffn_hidden_dim: int | None = None  # None: derived from dim and ffn_dim_multiplier
    activation: str = "silu"
    max_seq_len: int = 2048
    tie_embeddings: bool = False
    model_type: str = "transformer"
    num_experts: int = 0  # 0: dense
    moe_top_k: int = 2
    moe_frequency: int = 1
    moe_router: str = "softmax_topk"
    moe_shared_experts: int = 0
    moe_aux_loss_weight: float = 0.01
    moe_expert_ffn_multiplier: float = 1.0


@dataclass
class TrainConfig:
    batch_size: int = 8
    seq_len: int = 2048


@dataclass
class MetricsConfig:
    log_interval: int = 10
    enable_wandb: bool = False
    enable_tensorboard: bool = False
    wandb_project: str = "kempnerforge"
    wandb_run_name: str | None = None
    wandb_run_id: str = ""
    tensorboard_dir: str = "tb_logs"


@dataclass
class CheckpointConfig:
    dir: str = "checkpoints"
    interval: int = 1000


@dataclass
class DistributedConfig:
    dp_shard: int = -1  # -1: the ranks the other dims leave
    dp_replicate: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1


@dataclass
class JobConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
