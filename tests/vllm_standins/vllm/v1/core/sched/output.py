"""Stand-in of vllm/v1/core/sched/output.py (vLLM 0.32.0): NewRequestData, CachedRequestData and
SchedulerOutput with vLLM's fields (multimodal, sampling and LoRA fields kept, as
None or empty)."""
from dataclasses import dataclass, field


@dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: list | None
    mm_features: list
    sampling_params: object
    pooling_params: object
    block_ids: tuple
    num_computed_tokens: int
    lora_request: object
    prompt_embeds: object = None
    prefill_token_ids: list | None = None


@dataclass
class CachedRequestData:
    req_ids: list
    resumed_req_ids: set
    new_token_ids: list
    all_token_ids: dict
    new_block_ids: list
    num_computed_tokens: list
    num_output_tokens: list

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)

    @classmethod
    def make_empty(cls):
        return cls([], set(), [], {}, [], [], [])


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict
    total_num_scheduled_tokens: int
    scheduled_spec_decode_tokens: dict
    scheduled_encoder_inputs: dict
    finished_req_ids: set
    free_encoder_mm_hashes: list
    preempted_req_ids: set | None = None
    pending_structured_output_tokens: bool = False
    kv_connector_metadata: object = None
    has_sync_kv_loads: bool = False
    ec_connector_metadata: object = None
    num_common_prefix_blocks: list = field(default_factory=list)
