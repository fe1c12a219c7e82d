"""dpukv: KV-cache offload through the dpukv agent.

The client (Client, chunk_keys, ...) is the compiled extension dpukv._dpukv, built
with the project (CMake puts the package with its extension in the build's
python/ folder, and `cmake --install` into the system's). Where it is absent (a
`pip install ./python`, or a GPU machine's own interpreter it was not built for),
the same subset over the C ABI with ctypes (_ctypes_client.py, which loads
libdpukv_client.so: DPUKV_CLIENT_LIB, else the loader's path). connector/ is a
KV connector core for paged KV caches, device.py its device calls, vllm/ the
adapter to vLLM's connector contract. `dpukv.client_kind` says which client
loaded: "compiled" or "ctypes"."""
import os as _os

__version__ = "0.2.0"  # the agent's too (protocol/version.h); a test holds them equal

try:
    if _os.environ.get("DPUKV_PY_CLIENT") == "ctypes":  # tests of the ctypes client
        raise ImportError("DPUKV_PY_CLIENT=ctypes")
    from . import _dpukv as _native  # noqa: F401
    from ._dpukv import *  # noqa: F401,F403
    client_kind = "compiled"
except ImportError:
    from . import _ctypes_client as _native  # noqa: F401
    from ._ctypes_client import *  # noqa: F401,F403
    client_kind = "ctypes"

__all__ = [n for n in dir(_native) if not n.startswith("_")]
