"""Stand-in package (see vllm/__init__.py)."""
from .base import KVConnectorBase_V1, KVConnectorRole  # noqa: F401
