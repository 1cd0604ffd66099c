/**
 * Host stand-in for CANN's tiling/platform/platform_ascendc.h (PlatformAscendC): the vector
 * core count, a core memory's size and the AscendC system workspace, read from the
 * fe::PlatFormInfos the launcher fills (host_kernel/launch.cpp).
 */
#ifndef TILING_PLATFORM_PLATFORM_ASCENDC_H
#define TILING_PLATFORM_PLATFORM_ASCENDC_H

#include <cstdint>

#include "ascendc_host/graph.h"

namespace platform_ascendc {

enum class CoreMemType { L0_A = 0, L0_B = 1, L0_C = 2, L1 = 3, L2 = 4, UB = 5, HBM = 6, RESERVED };

class PlatformAscendC {
public:
    explicit PlatformAscendC(fe::PlatFormInfos *info) : info_(info) {}

    /** UB only: the other memories are not modelled (size 0). */
    void GetCoreMemSize(const CoreMemType &memType, uint64_t &size) const
    {
        size = memType == CoreMemType::UB ? info_->ubBytes : 0;
    }
    uint32_t GetCoreNumAiv() const { return info_->coreNumAiv; }
    uint32_t GetLibApiWorkSpaceSize() const { return info_->libApiWorkspaceBytes; }

private:
    fe::PlatFormInfos *info_;
};

}  // namespace platform_ascendc

#endif  // TILING_PLATFORM_PLATFORM_ASCENDC_H
