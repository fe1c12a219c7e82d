"""Stand-in of vllm.distributed.parallel_state: the tensor-parallel rank and size
of this worker. The contract test sets them per simulated rank (set_tp)."""
_tp = [0, 1]


def set_tp(rank: int, world_size: int) -> None:
    _tp[0], _tp[1] = rank, world_size


def get_tensor_model_parallel_rank() -> int:
    return _tp[0]


def get_tensor_model_parallel_world_size() -> int:
    return _tp[1]
