"""The decoder-only language model and the Hugging Face config fields it accepts."""
