"""`agentctx serve`: an OpenAI-compatible HTTP server over the embedded engine."""
