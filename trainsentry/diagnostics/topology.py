"""3D parallelism layout (tensor, pipeline, data parallel) and where each rank sits in it.

Rank order follows Megatron-LM's default (`tp-cp-ep-dp-pp` with cp = ep = 1): the tensor
rank varies fastest, then the data-parallel rank, then the pipeline stage:
`rank = tp_rank + TP * (dp_rank + DP * pp_stage)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


class TopologyError(ValueError):
    pass


class TopologyMismatchError(TopologyError):
    """A topology given by the caller that does not fit the job's world size."""


@dataclass(frozen=True, slots=True)
class Topology:
    tp: int
    pp: int
    dp: int

    def __post_init__(self) -> None:
        if min(self.tp, self.pp, self.dp) < 1:
            raise TopologyError(
                f"parallel sizes must be >= 1, got TP={self.tp} PP={self.pp} DP={self.dp}"
            )

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

    def stage_of(self, rank: int) -> int:
        return rank // (self.tp * self.dp)

    def tp_rank_of(self, rank: int) -> int:
        return rank % self.tp

    def dp_rank_of(self, rank: int) -> int:
        return (rank // self.tp) % self.dp

    def pipeline_group_of(self, rank: int) -> tuple[int, ...]:
        """The ranks that hold the same model shard in every stage (a PP group)."""
        tp_rank, dp_rank = self.tp_rank_of(rank), self.dp_rank_of(rank)
        return tuple(tp_rank + self.tp * (dp_rank + self.dp * s) for s in range(self.pp))

    def tensor_group_of(self, rank: int) -> tuple[int, ...]:
        base = rank - self.tp_rank_of(rank)
        return tuple(range(base, base + self.tp))

    def describe(self) -> str:
        return f"TP={self.tp} PP={self.pp} DP={self.dp}"


def parse_topology(text: str) -> Topology:
    """`TP,PP,DP` (e.g. `2,4,1`) as given on the command line."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise TopologyError(f"topology must be TP,PP,DP (three integers), got {text!r}")
    tp, pp, dp = (int(p) for p in parts)
    return Topology(tp, pp, dp)


_KEYS = {
    "tp": ("tp", "tensor_model_parallel_size", "tensor_parallel_size"),
    "pp": ("pp", "pipeline_model_parallel_size", "pipeline_parallel_size"),
    "dp": ("dp", "data_parallel_size"),
    "world": ("world_size", "world"),
}


def _lookup(config: dict[str, Any], kind: str) -> int | None:
    lowered = {str(k).lower(): v for k, v in config.items()}
    for key in _KEYS[kind]:
        value = lowered.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def topology_from_config(config: dict[str, Any]) -> Topology | None:
    """TP/PP/DP from a Megatrace-style `config.yaml` mapping; DP may come from world_size."""
    tp, pp, dp, world = (_lookup(config, k) for k in ("tp", "pp", "dp", "world"))
    if tp is None and pp is None:
        return None
    tp, pp = tp or 1, pp or 1
    if dp is None:
        dp = world // (tp * pp) if world and world % (tp * pp) == 0 else 1
    return Topology(tp, pp, dp)


def load_topology_file(path: Path) -> Topology | None:
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise TopologyError(f"{path}: cannot read topology: {exc}") from exc
    if not isinstance(data, dict):
        return None
    return topology_from_config(data)
