"""Ouro's config.json, read into the options loopscope.released.ouro builds from.

A checkpoint directory in Ouro's layout (ByteDance's Ouro-1.4B and Ouro-2.6B) describes
its model in config.json with the published config class's keys (hidden_size,
num_hidden_layers, num_attention_heads, num_key_value_heads, total_ut_steps, ...). Keys
that set a shape are required; the others take the published class's defaults when
absent. Keys naming a variant this layout does not implement (a sliding window, a
scaled rotary embedding, another activation, another model_type) are refused with
their key, so a config of another layout is not loaded into the wrong model. Keys that
only the published code's generation, training or exit selection read
(early_exit_threshold, use_cache, initializer_range, bos/eos/pad token ids,
transformers_version, auto_map, ...) are ignored: loopscope's exit rules replace the
published exit selection (the exit-score rule reads the same gate).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loopscope.base.errors import CheckpointError

CONFIG = "config.json"

# key -> the one value this layout implements (the published config's defaults)
FIXED: dict[str, Any] = {"model_type": "ouro", "hidden_act": "silu",
                         "use_sliding_window": False, "rope_scaling": None}
REQUIRED = ("hidden_size", "vocab_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "max_position_embeddings")
DEFAULTS: dict[str, Any] = {"tie_word_embeddings": False, "rms_norm_eps": 1e-6,
                            "rope_theta": 10_000.0, "total_ut_steps": 4}


@dataclass(frozen=True)
class OuroConfig:
    """The options of Ouro's layout, in loopscope's words; each field's comment names
    the config.json key it comes from. Ouro has no prelude and no coda blocks: its
    num_hidden_layers decoder layers are the core, run once per loop."""

    d_model: int  # hidden_size
    n_heads: int  # num_attention_heads (query heads)
    n_kv_heads: int  # num_key_value_heads (grouped-query heads when fewer)
    head_dim: int  # head_dim (hidden_size / num_attention_heads when absent)
    intermediate: int  # intermediate_size: the gated MLP's hidden width
    vocab_size: int  # vocab_size
    context: int  # max_position_embeddings: the longest window
    n_core: int  # num_hidden_layers: the decoder layers of one loop
    # total_ut_steps: the loops Ouro runs (it trained at this fixed depth); loopscope
    # reads it as R, the depth it is read at, under Huginn's config name
    mean_recurrence: int
    tie_embeddings: bool = False  # tie_word_embeddings: the head is the embedding
    norm_eps: float = 1e-6  # rms_norm_eps, of every RMSNorm
    rope_base: float = 10_000.0  # rope_theta

    n_prelude = 0  # blocks before the loop: none, the loop's input is the embedding
    n_coda = 0  # blocks after it: none, the readout is the final norm and the head

    def __post_init__(self) -> None:
        positive = ("d_model", "n_heads", "n_kv_heads", "head_dim", "intermediate",
                    "vocab_size", "context", "n_core", "mean_recurrence")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even (the rotary embedding "
                             "turns pairs of channels)")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"num_attention_heads {self.n_heads} must be a multiple of "
                             f"num_key_value_heads {self.n_kv_heads} (grouped-query heads)")
        if self.norm_eps <= 0 or self.rope_base <= 0:
            raise ValueError("rms_norm_eps and rope_theta must be > 0")

    def param_count(self) -> int:
        """OuroLM's parameters, a tied head once, from the config alone (what the memory
        checks and `plan` size a checkpoint by before reading its weights): the
        embedding, the decoder layers, the final norm, the exit gate and the head."""
        d = self.d_model
        return (self.vocab_size * d * (1 if self.tie_embeddings else 2)
                + self.n_core * layer_params(self) + d + d + 1)

    def readout_param_count(self) -> int:
        """The parameters read() runs: the final norm and the head."""
        return self.d_model + self.vocab_size * self.d_model

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> OuroConfig:
        """The options a config.json dict sets (Ouro's keys); ValueError naming the key
        for a missing, contradictory or unsupported one."""
        for key, value in FIXED.items():
            if key in raw and raw[key] != value:
                raise ValueError(f"{key} is {raw[key]!r}; Ouro's layout is {value!r}")
        missing = [k for k in REQUIRED if k not in raw]
        if missing:
            raise ValueError(f"missing {', '.join(missing)} (Ouro's layout needs them)")
        sliding = [t for t in raw.get("layer_types") or [] if t != "full_attention"]
        if sliding:
            raise ValueError(f"layer_types holds {sliding[0]!r}; Ouro's layout attends "
                             "over the full window in every layer ('full_attention')")
        get = {**DEFAULTS, **raw}.__getitem__
        heads = int(raw["num_attention_heads"])
        return cls(
            d_model=int(raw["hidden_size"]), n_heads=heads,
            n_kv_heads=int(raw["num_key_value_heads"]),
            head_dim=int(raw.get("head_dim") or int(raw["hidden_size"]) // heads),
            intermediate=int(raw["intermediate_size"]), vocab_size=int(raw["vocab_size"]),
            context=int(raw["max_position_embeddings"]),
            n_core=int(raw["num_hidden_layers"]), mean_recurrence=int(get("total_ut_steps")),
            tie_embeddings=bool(get("tie_word_embeddings")), norm_eps=float(get("rms_norm_eps")),
            rope_base=float(get("rope_theta")))

    @classmethod
    def read(cls, directory: Path) -> OuroConfig:
        """The config.json of a checkpoint directory; CheckpointError naming the file and
        the key when it is missing, unreadable or not Ouro's layout."""
        path = Path(directory) / CONFIG
        if not path.is_file():
            raise CheckpointError(f"{path}: no such file; a checkpoint directory in Ouro's "
                                  "layout holds config.json, its safetensors weights and "
                                  "tokenizer.json")
        try:
            raw = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise CheckpointError(f"{path}: not readable JSON ({err})") from err
        if not isinstance(raw, dict):
            raise CheckpointError(f"{path}: expected a JSON object of Ouro's config keys")
        try:
            return cls.from_json(raw)
        except (ValueError, TypeError) as err:
            raise CheckpointError(f"{path}: {err}") from err


def layer_params(cfg: OuroConfig) -> int:
    """The parameters of one decoder layer: the query, key, value and output
    projections, the gated MLP (gate, up, down) and four norm gains."""
    d, width = cfg.d_model, cfg.head_dim
    attention = d * (2 * cfg.n_heads + 2 * cfg.n_kv_heads) * width
    return attention + 3 * d * cfg.intermediate + 4 * d
