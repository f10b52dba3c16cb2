"""The KV hierarchy: host tier, GPU tier of page slots, page summaries, sparse decode."""

from engine.kv.selection import PageScorer
from engine.kv.sparse_config import SparseConfig, TierStats
from engine.kv.tiers import TieredKV

__all__ = ["PageScorer", "SparseConfig", "TieredKV", "TierStats"]
