"""Host KV caches shared with the agent in place, so that a load is one copy: the
agent's DMA engine writes each chunk straight into its blocks (RETRIEVE_ROWS), as
a DPU's DMA engine writes host memory the host exported, with no staging and no
scatter here.

Each distinct storage of the caches is exported with Client.share_memory: the
whole pages inside it move onto shared memory at the same addresses, bytes kept,
so the engine's tensors go on working. A storage's partial first and last pages
stay private (other objects may live there): a load with a row on them goes
through staging (vLLM never loads its block 0, the null block, which starts the
first page). Saves always go through staging: the
step's gather copies the blocks before vLLM may reuse them."""
import logging

from .. import _native as native

logger = logging.getLogger("dpukv.connector")

# A chunk's rows are one scatter list of the agent's DMA engine (agent_wire.h).
MAX_ROWS_PER_CHUNK = 64


def _storage(t):
    """The address and bytes of the storage under t (torch 1.x: storage())."""
    s = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
    return s.data_ptr(), s.nbytes()


class SharedCaches:
    """Per layer: the export that holds it and where its rows are in it."""

    def __init__(self, client, layout):
        self.ok = False
        self.reason = ""
        self.row_bytes = layout.chunk_bytes // layout.rows_per_chunk
        if not getattr(client, "agent_rows", False):
            self.reason = "the agent does not load into rows (an older agent, or --compress)"
            return
        if layout.rows_per_chunk > MAX_ROWS_PER_CHUNK:
            self.reason = (f"a chunk is {layout.rows_per_chunk} rows, more than the agent's "
                           f"{MAX_ROWS_PER_CHUNK}")
            return
        exports = {}  # storage address -> (staging, its first byte)
        self.layer_export, self.layer_base, self.strides = [], [], []
        for view in layout.kv_rows:
            key, nbytes = _storage(view)
            if key not in exports:
                try:
                    st = client.share_memory(key, nbytes)
                except (native.AgentUnavailable, RuntimeError, ValueError) as e:
                    self.reason = f"share_memory: {e}"
                    return
                exports[key] = st
            st = exports[key]
            self.layer_export.append(st)
            # Byte offset of the view's first element in the export, and its row strides.
            self.layer_base.append(view.data_ptr() - st.data_ptr)
            isz = view.element_size()
            self.strides.append([s * isz for s in view.stride()[:-1]])
        self.size = [st.size for st in self.layer_export]
        self.exports = list(exports.values())
        self.ok = True

    def offsets(self, layer, rows):
        """The byte offsets in the layer's export of rows (layout.rows' answer), or
        None when one of them lies outside the shared pages."""
        st = self.strides[layer]
        if isinstance(rows, tuple):  # strided caches: (blocks, parts)
            rel = rows[0] * st[0] + rows[1] * st[1]
        else:
            rel = rows * st[0]
        off = rel + self.layer_base[layer]
        if int(off.min()) < 0 or int(off.max()) + self.row_bytes > self.size[layer]:
            return None
        return off.numpy()


def share(client, layout):
    """SharedCaches of the layout's caches, or None (with the reason logged) when
    loads cannot go in place."""
    if any(t.device.type != "cpu" for t in layout.kv):
        return None
    s = SharedCaches(client, layout)
    if not s.ok:
        logger.info("dpukv: loads go through staging: %s", s.reason)
        return None
    return s

