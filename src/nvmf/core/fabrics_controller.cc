#include "nvmf/core/fabrics_controller.h"

#include <cstring>

#include "nvme/fabrics_spec.h"
#include "nvmf/core/target_side.h"

namespace dpukv::nvme {

void FabricsController::complete(Request* r, uint16_t status) {
  r->queue->req_complete(r, status);
}

void FabricsController::drop(Request* r) {
  r->queue->req_drop(r);
}

bool FabricsController::transport_log(uint8_t lid, std::vector<uint8_t>* page) {
  if (!config().discovery || lid != kLogDiscovery) return false;
  *page = target->discovery_log(hostnqn);
  return true;
}

// Property Get/Set: the registers over the admin queue.
uint16_t FabricsController::admin_transport(Request* r) {
  if (r->cmd.opc != kFabricsOpcode) return kInvalidOpcode;
  const uint8_t fctype = fabrics_type(r->cmd), attrib = property_attrib(r->cmd);
  const uint32_t offset = property_offset(r->cmd);
  uint32_t size = (attrib & 7) == 1 ? 8 : (attrib & 7) == 0 ? 4 : 0;
  bool wide = offset == kRegCap || offset == kRegAsq || offset == kRegAcq;
  if (size == 0 || offset >= kRegEnd || offset % 4 != 0 || (size == 8) != wide)
    return kInvalidField;
  if (fctype == kPropertyGet) {
    uint64_t v = read_reg(offset, size);
    r->dw0 = static_cast<uint32_t>(v);
    r->dw1 = static_cast<uint32_t>(v >> 32);
    return kSuccess;
  }
  if (fctype == kPropertySet) {
    if (offset != kRegCc && offset != kRegNssr) return kInvalidField;  // read-only over fabrics
    write_reg(offset, size, property_value(r->cmd));
    return kSuccess;
  }
  return kInvalidOpcode;
}

// A controller reset ends the association's I/O queues; the host reconnects them.
void FabricsController::on_disable() {
  for (size_t q = 1; q < queues.size(); ++q)
    if (queues[q] != nullptr) queues[q]->close("controller reset");
}

}  // namespace dpukv::nvme
