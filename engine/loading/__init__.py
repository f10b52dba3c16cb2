"""Model loading: resolving a model name or path, GGUF reading and conversion, the quantized
CPU weights, the default model and the cache paths. Imports nothing heavy itself."""
