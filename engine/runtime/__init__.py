"""The engine loop: requests and their streams, the continuous-batching step, the KV pool's
sizing and its statistics, and the public Engine on top."""
