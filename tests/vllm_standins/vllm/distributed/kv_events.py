"""Stand-in of the KV cache events of vllm/distributed/kv_events.py: BlockStored,
BlockRemoved and AllBlocksCleared with vLLM's field names (vLLM's are msgspec
Structs; these are dataclasses with the same keyword construction)."""
from dataclasses import dataclass
from typing import Any


class KVCacheEvent:
    pass


@dataclass
class BlockStored(KVCacheEvent):
    block_hashes: list
    parent_block_hash: Any
    token_ids: list
    block_size: int
    lora_id: Any
    medium: Any
    lora_name: Any
    extra_keys: Any = None
    group_idx: Any = None


@dataclass
class BlockRemoved(KVCacheEvent):
    block_hashes: list
    medium: Any
    group_idx: Any = None


@dataclass
class AllBlocksCleared(KVCacheEvent):
    pass
