"""The connector's device calls, behind one small interface: staging memory the
agent can reach, a side stream, events and waits. The connector's code is the same
on every backend; only these calls differ.

  TorchCuda   torch's CUDA on a GPU: staging is a CUDA tensor exported to the
              agent (its CUDA IPC handle), gathers and scatters run on a side
              stream, and the compute stream waits for an event, never the host.
  CudaDouble  CI without a GPU: the CUDA driver TEST DOUBLE (tests/cuda_double/)
              through ctypes. Its device memory is a memfd mapping in this
              process, so torch (CPU) reads and writes it through a tensor view;
              events are the double's. It does not make the GPU path verified.
  HostDevice  host tensors and host staging (shared memory the agent maps):
              nothing is asynchronous, so its streams, events and waits do
              nothing, and the connector's code has no "no device" branch.

When the agent has no GPU path (no driver there, or not this GPU) the staging
falls back to host memory, registered with the driver (pinned) where there is
one, so the host-to-device copy of layer l runs while the agent copies layer l+1.
"""
import ctypes
import os

import torch

from . import _native as native


class CudaDouble:
    """The driver double's memory and events (CI). library: its libcuda.so.1
    (default: $DPUKV_CUDA_DRIVER)."""

    name = "cuda-double"

    def __init__(self, library=None):
        library = library or os.environ.get("DPUKV_CUDA_DRIVER")
        if not library:
            raise ValueError("CudaDouble needs the double's path (or DPUKV_CUDA_DRIVER)")
        self.lib = ctypes.CDLL(library)
        self._check(self.lib.cuInit(0), "cuInit")
        dev = ctypes.c_int()
        self._check(self.lib.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
        ctx = ctypes.c_void_p()
        self._check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "ctx")
        self._check(self.lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        self.index = 0
        self._keep = []

    @staticmethod
    def _check(r, what):
        if r != 0:
            raise RuntimeError(f"{what}: CUDA error {r}")

    def alloc(self, nbytes):
        """Device memory: (device pointer, a uint8 tensor over it)."""
        p = ctypes.c_ulonglong()
        self._check(self.lib.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(nbytes)),
                    "cuMemAlloc")
        buf = (ctypes.c_uint8 * nbytes).from_address(p.value)
        self._keep.append(buf)
        return p.value, torch.frombuffer(buf, dtype=torch.uint8)

    def pin(self, staging):
        """Registers host staging with the double (cuMemHostRegister), as TorchCuda
        pins it with the driver."""
        view = memoryview(staging)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(view))
        return self.lib.cuMemHostRegister_v2(ctypes.c_void_p(addr), ctypes.c_size_t(len(view)),
                                             0) == 0

    def unpin(self, staging):
        view = memoryview(staging)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(view))
        return self.lib.cuMemHostUnregister(ctypes.c_void_p(addr)) == 0

    def stream(self):
        return None

    def use(self, stream):
        return _NoStream()

    def record(self, stream=None):
        ev = ctypes.c_void_p()
        self._check(self.lib.cuEventCreate(ctypes.byref(ev), 2), "cuEventCreate")
        self._check(self.lib.cuEventRecord(ev, None), "cuEventRecord")
        return _DoubleEvent(self.lib, ev)

    def done(self, event):
        return event.query()

    def host_wait(self, event):
        event.synchronize()

    def compute_wait(self, event):
        # CPU torch runs the work in order at once: the compute "stream" is the
        # host; wait as it would.
        event.synchronize()

    def compute_done_first(self, stream):
        pass  # CPU torch: the compute work is done when its call returns


class HostDevice:
    """Host memory on both sides of every copy: copies are synchronous, so there
    is no side stream to order and no event to wait for."""

    name = "host"

    def pin(self, staging):
        return False

    def unpin(self, staging):
        pass

    def stream(self):
        return None

    def use(self, stream):
        return _NoStream()

    def record(self, stream=None):
        return None

    def done(self, event):
        return True

    def host_wait(self, event):
        pass

    def compute_wait(self, event):
        pass

    def compute_done_first(self, stream):
        pass


HOST = HostDevice()


class _DoubleEvent:
    def __init__(self, lib, ev):
        self.lib, self.ev = lib, ev

    def query(self):
        return self.lib.cuEventQuery(self.ev) == 0

    def synchronize(self):
        r = self.lib.cuEventSynchronize(self.ev)
        if r != 0:
            raise RuntimeError(f"cuEventSynchronize: CUDA error {r}")

    def __del__(self):
        self.lib.cuEventDestroy_v2(self.ev)


class _NoStream:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class TorchCuda:
    """torch's CUDA on a GPU: staging is a CUDA tensor; a side stream for the
    connector's gathers and scatters."""

    name = "cuda"

    def __init__(self, device):
        self.device = torch.device(device)
        self.index = self.device.index if self.device.index is not None else 0
        self._side = torch.cuda.Stream(self.device)

    def alloc(self, nbytes):
        t = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        return t.data_ptr(), t

    def pin(self, staging):
        """Registers host staging with the driver (page-locked): the fallback's
        H2D copies then run asynchronously."""
        view = memoryview(staging)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(view))
        r = torch.cuda.cudart().cudaHostRegister(addr, len(view), 0)
        return int(r) == 0

    def unpin(self, staging):
        """The lock pin() took; before the staging's memory goes (the driver keeps a
        registration of unmapped memory, and a later mapping there cannot be pinned)."""
        view = memoryview(staging)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(view))
        return int(torch.cuda.cudart().cudaHostUnregister(addr)) == 0

    def stream(self):
        return self._side

    def use(self, stream):
        return torch.cuda.stream(stream)

    def record(self, stream=None):
        ev = torch.cuda.Event()
        ev.record(stream or torch.cuda.current_stream(self.device))
        return ev

    def done(self, event):
        return event.query()

    def host_wait(self, event):
        event.synchronize()

    def compute_wait(self, event):
        torch.cuda.current_stream(self.device).wait_event(event)

    def compute_done_first(self, stream):
        """stream's next work runs after what the compute stream has queued."""
        stream.wait_stream(torch.cuda.current_stream(self.device))


def for_tensors(kv_caches):
    """The backend for KV caches on this device: TorchCuda for CUDA tensors, else
    HostDevice (host staging)."""
    t = kv_caches[0]
    if t.is_cuda:
        return TorchCuda(t.device)
    return HOST


def export_staging(client, device, nbytes):
    """GPU staging the agent copies into: (staging, uint8 tensor view), or None
    with the reason when the agent has no GPU path for this device."""
    if not client.agent_gpu:
        return None, "the agent has no GPU path (dpukv stat: gpu path)"
    ptr, view = device.alloc(nbytes)
    try:
        staging = client.export_gpu(ptr, nbytes, device.index)
    except (native.GpuPathUnavailable, ValueError) as e:
        # ValueError: memory the driver cannot export (e.g. torch's expandable
        # segments, which are not cuMemAlloc allocations).
        return None, str(e)
    return (staging, view), None
