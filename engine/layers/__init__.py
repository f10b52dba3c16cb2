"""The model's layers: attention over the paged or tiered KV, rotary embedding, the sampler and
the per-step context they read."""
