"""Huginn's config.json, read into the options loopscope.released.huginn builds from.

A checkpoint directory in Huginn's layout describes its model in config.json with the
published config class's keys (n_embd, n_heads or num_attention_heads, block_size,
n_layers_in_prelude, mean_recurrence, ...). Keys that set a shape are required; the
others take the published class's defaults when absent (its own example config omits
rope_base, for one). Keys naming a part of the architecture (block_class_name,
injection_type, ...) must name the parts this layout implements, so a config for
another variant is refused with its key, not loaded into the wrong model. Keys that
only the published code's training or generation read (init_strategy, auto_map,
transformers_version, ...) are ignored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loopscope.base.errors import CheckpointError

CONFIG = "config.json"

# key -> the one value this layout implements (the published config's defaults)
FIXED = {"block_class_name": "SandwichBlock", "norm_class_name": "RMSNorm_llama",
         "mlp_class_name": "GatedMLP", "nonlin_name": "SiLU", "injection_type": "linear",
         "state_init": "like-init", "sampling_scheme": "poisson-lognormal-filling",
         "architecture_class_name": "RecurrentGPT"}
REQUIRED = ("n_embd", "vocab_size", "block_size", "intermediate_size", "n_layers_in_prelude",
            "n_layers_in_recurrent_block", "n_layers_in_coda", "mean_recurrence")
DEFAULTS: dict[str, Any] = {"tie_embeddings": True, "bias": False, "qk_bias": True,
                            "norm_eps": 1e-6, "rope_base": 50_000.0, "mean_backprop_depth": 8,
                            "test_time_noise": 0}


@dataclass(frozen=True)
class HuginnConfig:
    """The options of Huginn's layout, in loopscope's words; each field's comment
    names the config.json key it comes from."""

    d_model: int  # n_embd
    n_heads: int  # n_heads (num_attention_heads)
    n_kv_heads: int  # num_key_value_heads; Huginn's equals n_heads
    intermediate: int  # intermediate_size: the gated MLP's hidden width
    vocab_size: int  # vocab_size (the embedding's rows, padded_vocab_size if given)
    context: int  # block_size: the rotary table's length, the longest window
    n_prelude: int  # n_layers_in_prelude
    n_core: int  # n_layers_in_recurrent_block
    n_coda: int  # n_layers_in_coda
    mean_recurrence: int  # the depth it is read at (R), the training sampler's mean
    mean_backprop_depth: int  # loops of each training step that built a graph
    tie_embeddings: bool = True  # the head is the embedding
    adapter_bias: bool = False  # bias: the adapter's bias (the only biased linear map)
    qk_bias: bool = True  # a learned bias on the query and key heads
    norm_eps: float = 1e-6
    rope_base: float = 50_000.0

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def __post_init__(self) -> None:
        positive = ("d_model", "n_heads", "intermediate", "vocab_size", "context", "n_core",
                    "mean_recurrence")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("n_prelude", "n_coda", "mean_backprop_depth"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.d_model % self.n_heads or self.head_dim % 2:
            raise ValueError(f"n_embd {self.d_model} must split into {self.n_heads} heads of an "
                             "even width (the rotary embedding turns channel pairs)")
        if self.n_kv_heads != self.n_heads:
            raise ValueError(f"num_key_value_heads {self.n_kv_heads} differs from n_heads "
                             f"{self.n_heads}: Huginn's query/key bias is per query head, so "
                             "its layout has no grouped-query heads")
        if self.norm_eps <= 0 or self.rope_base <= 0:
            raise ValueError("norm_eps and rope_base must be > 0")

    def param_count(self) -> int:
        """HuginnLM's parameters, the tied head once, from the config alone (what the
        memory checks and `plan` size a checkpoint by before reading its weights)."""
        d = self.d_model
        return (self.vocab_size * d * (1 if self.tie_embeddings else 2)
                + (self.n_prelude + self.n_core + self.n_coda) * block_params(self)
                + 2 * d * d + (d if self.adapter_bias else 0) + d)

    def readout_param_count(self) -> int:
        """The parameters read() runs: the coda, ln_f and the head."""
        return self.n_coda * block_params(self) + self.d_model + self.vocab_size * self.d_model

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> HuginnConfig:
        """The options a config.json dict sets (Huginn's keys); ValueError naming the key
        for a missing, contradictory or unsupported one."""
        missing = [k for k in REQUIRED if k not in raw]
        if missing:
            raise ValueError(f"missing {', '.join(missing)}")
        if "n_heads" not in raw and "num_attention_heads" not in raw:
            raise ValueError("missing n_heads (or num_attention_heads)")
        for key, value in FIXED.items():
            if key in raw and raw[key] != value:
                raise ValueError(f"{key} is {raw[key]!r}; Huginn's layout is {value!r}")
        get = {**DEFAULTS, **raw}.__getitem__
        if get("test_time_noise"):
            raise ValueError(f"test_time_noise is {get('test_time_noise')}; only 0 (no noise "
                             "between loops, the published default) is implemented")
        heads = int(raw.get("n_heads", raw.get("num_attention_heads")))
        if int(raw.get("num_attention_heads", heads)) != heads:
            raise ValueError(f"n_heads {heads} and num_attention_heads "
                             f"{raw['num_attention_heads']} disagree")
        vocab = int(raw["vocab_size"])
        if int(raw.get("padded_vocab_size", vocab)) != vocab:
            raise ValueError(f"padded_vocab_size {raw['padded_vocab_size']} differs from "
                             f"vocab_size {vocab} (the published config sets them equal)")
        return cls(
            d_model=int(get("n_embd")), n_heads=heads,
            n_kv_heads=int(raw.get("num_key_value_heads", heads)),
            intermediate=int(get("intermediate_size")), vocab_size=vocab,
            context=int(get("block_size")), n_prelude=int(get("n_layers_in_prelude")),
            n_core=int(get("n_layers_in_recurrent_block")), n_coda=int(get("n_layers_in_coda")),
            mean_recurrence=int(get("mean_recurrence")),
            mean_backprop_depth=int(get("mean_backprop_depth")),
            tie_embeddings=bool(get("tie_embeddings")), adapter_bias=bool(get("bias")),
            qk_bias=bool(get("qk_bias")), norm_eps=float(get("norm_eps")),
            rope_base=float(get("rope_base")))

    @classmethod
    def read(cls, directory: Path) -> HuginnConfig:
        """The config.json of a checkpoint directory; CheckpointError naming the file and
        the key when it is missing, unreadable or not Huginn's layout."""
        path = Path(directory) / CONFIG
        if not path.is_file():
            raise CheckpointError(f"{path}: no such file; a checkpoint directory in Huginn's "
                                  "layout holds config.json, its safetensors weights and "
                                  "tokenizer.json")
        try:
            raw = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise CheckpointError(f"{path}: not readable JSON ({err})") from err
        if not isinstance(raw, dict):
            raise CheckpointError(f"{path}: expected a JSON object of Huginn's config keys")
        try:
            return cls.from_json(raw)
        except (ValueError, TypeError) as err:
            raise CheckpointError(f"{path}: {err}") from err


def block_params(cfg: HuginnConfig) -> int:
    """The parameters of one sandwich block: Wqkv, the query/key bias, proj, the gated
    MLP (fc: 2 x intermediate, proj) and four norm gains."""
    d, dh = cfg.d_model, cfg.head_dim
    return (d * (cfg.n_heads + 2 * cfg.n_kv_heads) * dh + (2 * cfg.n_heads * dh if cfg.qk_bias
                                                          else 0)
            + d * d + 3 * d * cfg.intermediate + 4 * d)
