"""What vLLM's scheduler tells its workers each step (ReqMeta in
DpukvConnectorMetadata), and what a request's keys are made of besides its
tokens: its extra keys (LoRA adapter, cache_salt) and its multimodal items."""
import hashlib
from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata


@dataclass
class ReqMeta:
    """One request's work in a step: load chunks [load_from, load_to) into its
    blocks, save chunks [save_from, save_to) out of them."""
    req_id: str
    token_ids: list
    block_ids: list
    load_from: int = 0
    load_to: int = 0
    save_from: int = 0
    save_to: int = 0
    lookup_ns: int = 0  # when the scheduler looked the hit up (CLOCK_MONOTONIC, this host)
    salt: int = 0  # the request's extra keys (LoRA, cache_salt), folded into its keys' layout


@dataclass
class DpukvConnectorMetadata(KVConnectorMetadata):
    requests: list = field(default_factory=list)


def _lora(request):
    """A request's LoRA adapter as vLLM's KV events name it: (id, name), or Nones."""
    lora = getattr(request, "lora_request", None)
    if lora is None:
        return None, None
    return getattr(lora, "lora_int_id", None), getattr(lora, "lora_name", None)


def request_salt(request):
    """What a request's KV depends on besides its tokens and the model, for the
    whole prompt: its LoRA adapter and its cache_salt, as 64 bits folded into every
    key's layout (0: neither). BLAKE2b with a personalization string: a namespace,
    not a secret (anyone who knows the salt computes the keys). Isolation between
    users is the agent's: it puts each client in a tenant from its uid, group or
    socket and keeps tenants' chunks apart (docs/protocols.md, Tenants); the salt
    only separates requests of one tenant, as vLLM's prefix cache does."""
    parts = []
    lora = getattr(request, "lora_request", None)
    if lora is not None:
        parts.append(f"lora\0{getattr(lora, 'lora_name', '')}\0{getattr(lora, 'lora_int_id', '')}")
    salt = getattr(request, "cache_salt", None)
    if salt:
        parts.append(f"salt\0{salt}")
    if not parts:
        return 0
    digest = hashlib.blake2b("\0\0".join(parts).encode(), digest_size=8,
                             person=b"dpukv-extra").digest()
    return int.from_bytes(digest, "little") or 1


def key_tokens(request):
    """The token ids a request's keys are made of: its prompt, with each multimodal
    item's placeholder tokens (the same for every image) replaced by ids drawn
    from the item's own hash, negative so that no prompt has them. The chunk
    holding an item and every chunk after it get keys of their own, as vLLM's
    block hashes do; the chunks before it stay shared."""
    tokens = list(getattr(request, "prompt_token_ids", None) or [])
    for f in getattr(request, "mm_features", None) or []:
        pos, ident = getattr(f, "mm_position", None), getattr(f, "identifier", None)
        if pos is None or ident is None:
            continue
        first, n = int(pos.offset), int(pos.length)
        stream = hashlib.shake_256(b"dpukv-mm\0" + str(ident).encode()).digest(4 * max(n, 0))
        for i in range(max(0, first), min(len(tokens), first + n)):
            v = int.from_bytes(stream[4 * (i - first):4 * (i - first) + 4], "little")
            tokens[i] = -1 - (v & 0x7FFFFFFF)
    return tokens
