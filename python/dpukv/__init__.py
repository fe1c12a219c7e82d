"""dpukv: KV-cache offload through the dpukv agent.

The client (Client, chunk_keys, ...) is the compiled module _dpukv; connector.py
is a KV connector core for paged KV caches and model.py a small Llama decoder
for tests and benchmarks."""
import _dpukv as _native  # noqa: F401  (the compiled client, found on sys.path)
from _dpukv import *  # noqa: F401,F403

__all__ = [n for n in dir(_native) if not n.startswith("_")]
