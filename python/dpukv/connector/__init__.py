"""dpukv's KV connector, laid out as vLLM lays out its own connectors:

  core.py       DpukvConnector, the engine-independent connector (both sides)
  scheduler.py  the scheduler part: one lookup of every layer, pinned; leases
  worker.py     the worker part: layerwise loads and saves through staging
  staging.py    staging memory, its device path, its load and save slots
  layout.py     the KV caches' shapes, chunk keys' layouts, blocks as rows
  codec.py      chunks encoded before they are stored (kv_codec: lossless, int8, int4)

dpukv.vllm's DpukvConnectorV1 is the vLLM adapter over these parts."""
from .codec import CODECS
from .core import DpukvConnector
from .layout import KvLayout, layer_layouts
from .scheduler import Lookup, lookup, release_pins
from .worker import LoadMiss

__all__ = ["CODECS", "DpukvConnector", "KvLayout", "LoadMiss", "Lookup", "layer_layouts", "lookup",
           "release_pins"]
