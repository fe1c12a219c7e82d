"""Stand-in of vllm.v1.core.kv_cache_manager.KVCacheBlocks: what a connector calls
on it, get_block_ids() (a list of block ids per KV cache group). vLLM's holds
KVCacheBlock objects; this one holds their ids."""
from dataclasses import dataclass


@dataclass
class KVCacheBlocks:
    ids: tuple  # per KV cache group, a list of block ids

    def get_block_ids(self) -> tuple:
        return tuple(list(g) for g in self.ids)
