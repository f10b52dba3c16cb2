"""The KV hierarchy: host tier, GPU tier of page slots, page summaries, sparse decode."""

from engine.kv.tiers import SparseConfig, TieredKV, TierStats

__all__ = ["SparseConfig", "TieredKV", "TierStats"]
