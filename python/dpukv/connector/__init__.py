"""dpukv's KV connector, laid out as vLLM lays out its own connectors:

  core.py       DpukvConnector, the engine-independent connector (both sides)
  scheduler.py  the scheduler part: one lookup of every layer, pinned; leases
  worker.py     the worker part: layerwise loads and saves through staging
  staging.py    staging memory, its device path, its load and save slots
  layout.py     the KV caches' shapes, chunk keys' layouts, blocks as rows

dpukv.vllm's DpukvConnectorV1 is the vLLM adapter over these parts."""
from .core import DpukvConnector
from .layout import KvLayout, layer_layouts
from .scheduler import Lookup, lookup, release_pins
from .worker import LoadMiss

__all__ = ["DpukvConnector", "KvLayout", "LoadMiss", "Lookup", "layer_layouts", "lookup",
           "release_pins"]
