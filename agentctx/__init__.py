"""agentctx: the application over the embedded engine."""

from agentctx.app_paths import keep_compiler_caches_inside

keep_compiler_caches_inside()  # nothing in the system temp folder or ~/.triton
