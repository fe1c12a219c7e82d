"""Stand-in of vllm/distributed/kv_transfer/kv_connector/v1/base.py as vLLM 0.32.0
has it (python/vllm-requirements.txt): KVConnectorRole, KVConnectorMetadata and
KVConnectorBase_V1 with the same public members and parameters (the abstract ones
abstract), their defaults reduced to what they return. Two members are from older
vLLMs (commit 13f4ad0f55b08ca1d37d1459f50ce950feaeb547), whose cross-layer path the
adapter keeps: prefer_cross_layer_blocks and register_cross_layers_kv_cache.
test_vllm_contract.py::test_the_stand_ins_match_the_installed_vllm compares this
file with the installed vLLM, member by member, wherever vLLM is importable."""
import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any


class KVConnectorRole(enum.Enum):
    SCHEDULER = 0
    WORKER = 1


class KVConnectorMetadata(ABC):  # noqa: B024
    pass


@dataclass
class KVConnectorTransferResults:
    finished_sending: set = field(default_factory=set)
    finished_recving: set = field(default_factory=set)
    failed_recving: set = field(default_factory=set)


class KVConnectorBase_V1(ABC):  # noqa: N801: vLLM's name
    @property
    def prefer_cross_layer_blocks(self) -> bool:
        return False

    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config):
        self._connector_metadata = None
        self._vllm_config = vllm_config
        if vllm_config.kv_transfer_config is None:
            raise ValueError("kv_transfer_config must be set for KVConnectorBase_V1")
        self._kv_transfer_config = vllm_config.kv_transfer_config
        self._kv_cache_config = kv_cache_config
        self._role = role

    @property
    def role(self) -> KVConnectorRole:
        return self._role

    # Worker side.
    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        self._connector_metadata = connector_metadata

    def clear_connector_metadata(self) -> None:
        self._connector_metadata = None

    def _get_connector_metadata(self) -> KVConnectorMetadata:
        assert self._connector_metadata is not None
        return self._connector_metadata

    def has_connector_metadata(self) -> bool:
        return self._connector_metadata is not None

    def register_kv_caches(self, kv_caches):
        return

    def register_cross_layers_kv_cache(self, kv_cache, attn_backend):
        return

    def handle_preemptions(self, kv_connector_metadata):
        return

    @abstractmethod
    def start_load_kv(self, forward_context, **kwargs: Any) -> None:
        pass

    @abstractmethod
    def wait_for_layer_load(self, layer_name: str) -> None:
        pass

    @abstractmethod
    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata, **kwargs: Any) -> None:
        pass

    @abstractmethod
    def wait_for_save(self):
        pass

    def get_finished(self, finished_req_ids: set):
        return None, None

    def get_block_ids_with_load_errors(self) -> set:
        return set()

    def shutdown(self):
        return None

    # Scheduler side.
    @abstractmethod
    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        pass

    @abstractmethod
    def update_state_after_alloc(self, request, blocks, num_external_tokens: int):
        pass

    @abstractmethod
    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        pass

    def update_connector_output(self, connector_output):
        return

    def request_finished(self, request, block_ids):
        return False, None

    def take_events(self):
        return ()

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config):
        if cls is KVConnectorBase_V1:
            raise TypeError("get_required_kvcache_layout should not be called on the abstract "
                            "base class")
        return None

    # Members of vLLM 0.32's base class the adapter leaves to their defaults.
    @property
    def supports_divergent_local_hybrid_hits(self) -> bool:
        return False

    @property
    def requires_kv_delivery(self) -> bool:
        return bool(getattr(self._kv_transfer_config, "is_kv_producer", False))

    def get_mem_pool_context(self):
        return None

    def set_host_xfer_buffer_ops(self, copy_operation):
        return

    def finish_forward(self) -> None:
        return

    def reset_capture_state(self) -> None:
        return

    def get_transfer_results(self, finished_req_ids: set):
        sending, recving = self.get_finished(finished_req_ids)
        return KVConnectorTransferResults(set(sending or ()), set(recving or ()))

    def get_kv_connector_stats(self):
        return None

    def get_kv_connector_kv_cache_events(self):
        return None

    def get_handshake_metadata(self):
        return None

    def build_connector_worker_meta(self):
        return None

    def bind_kv_cache_manager(self, kv_cache_manager) -> None:
        self._kv_cache_manager = kv_cache_manager
        self.bind_gpu_block_pool(kv_cache_manager.block_pool)

    def bind_gpu_block_pool(self, gpu_block_pool) -> None:
        return

    def get_loaded_kv_cache_group_ids(self, request) -> tuple:
        return (0,)

    def get_external_cache_hit_sources(self, request, num_external_tokens: int) -> dict:
        return {} if num_external_tokens == 0 else {"external": num_external_tokens}

    def on_new_request(self, request) -> None:
        return

    def register_finished_partial_tail(self, request, block_ids, partial_tail_offloads) -> bool:
        return False

    def has_pending_block_frees(self) -> bool:
        return False

    def has_pending_push_work(self) -> bool:
        return False

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config) -> bool:
        return False

    def get_finished_count(self):
        return None

    @classmethod
    def build_kv_connector_stats(cls, data=None):
        return None

    def set_xfer_handshake_metadata(self, metadata) -> None:
        return None

    def set_xfer_handshake_metadata_pp_aware(self, metadata) -> None:
        self.set_xfer_handshake_metadata({tp: m for (_, tp), m in metadata.items()})

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        return None

    def reset_cache(self):
        return None
