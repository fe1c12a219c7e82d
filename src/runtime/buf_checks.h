// The checks every engine applies to a task's buffers before touching memory:
// what an engine may read and write, seen through aliases of the same pages.
#pragma once

#include <cstdint>

#include "runtime/buf.h"
#include "runtime/status.h"

namespace dpukv {

// src: the data sections of its list are read. dst: bytes are written after each
// buffer's data, in list order. Checks list lengths (TOO_BIG), started maps
// (BAD_STATE), read/write permission (NOT_PERMITTED), every segment inside its
// map (INVALID_VALUE), total source bytes <= max_bytes (TOO_BIG), with
// need_room_for_src the destination's room >= the source (TOO_BIG), and no overlap
// between the source and the destination room that would be written
// (INVALID_VALUE). Overlap is judged on the backing file pages, so an import of a
// map exported by this process is the same memory as the export.
Status check_transfer(const Buf* src, const Buf* dst, uint32_t max_list_len, uint64_t max_bytes,
                      bool need_room_for_src);

}  // namespace dpukv
