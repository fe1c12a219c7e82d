"""dpukv: KV-cache offload through the dpukv agent.

The client (Client, chunk_keys, ...) is the compiled module _dpukv; where it was
not built for this Python (a GPU machine's own interpreter), the same subset over
the C ABI with ctypes (_ctypes_client.py, libdpukv_client.so). connector.py is a KV
connector core for paged KV caches, device.py its device calls, and model.py a
small Llama decoder for tests and benchmarks."""
import os as _os

try:
    if _os.environ.get("DPUKV_PY_CLIENT") == "ctypes":  # tests of the ctypes client
        raise ImportError("DPUKV_PY_CLIENT=ctypes")
    import _dpukv as _native  # noqa: F401  (the compiled client, found on sys.path)
    from _dpukv import *  # noqa: F401,F403
except ImportError:
    from . import _ctypes_client as _native  # noqa: F401
    from ._ctypes_client import *  # noqa: F401,F403

__all__ = [n for n in dir(_native) if not n.startswith("_")]
