/**
 * What a kernel entry and its class use besides tensors, queues and instructions: the
 * kernel-entry macros (GM_ADDR, KERNEL_TASK_TYPE_DEFAULT, GET_TILING_DATA, TILING_KEY_IS),
 * the core's identity (GetBlockIdx, GetBlockNum) and intra-core synchronisation.
 *
 * The host runs every instruction in program order, so PipeBarrier has nothing to order
 * (on the device it orders one pipe; with cce-auto-sync the compiler inserts PIPE_V and
 * V<->S synchronisation itself). SetFlag/WaitFlag are paired: a WaitFlag without a SetFlag
 * of the same event and ID would wait forever on the device, and fails here.
 */
#ifndef ASCENDC_HOST_KERNEL_ENTRY_H
#define ASCENDC_HOST_KERNEL_ENTRY_H

#include <cstdint>
#include <cstring>
#include <string>

#include "ascendc_host/pipe.h"
#include "ascendc_host/runtime.h"

#define GM_ADDR __gm__ uint8_t *

// CCE builtins: global names in CANN.
enum pipe_t { PIPE_S, PIPE_V, PIPE_M, PIPE_MTE1, PIPE_MTE2, PIPE_MTE3, PIPE_ALL };
enum event_t { EVENT_ID0, EVENT_ID1, EVENT_ID2, EVENT_ID3, EVENT_ID4, EVENT_ID5, EVENT_ID6,
               EVENT_ID7 };

enum KernelTaskType { KERNEL_TYPE_AIV_ONLY, KERNEL_TYPE_AIC_ONLY, KERNEL_TYPE_MIX_AIC_1_1,
                      KERNEL_TYPE_MIX_AIC_1_2 };

namespace ascendc_host {

inline void DeclareTaskType(KernelTaskType type) { Launch().taskType = type; }

/** GET_TILING_DATA: the tiling bytes op_host saved, as the registered TilingData type. */
template <typename TilingData>
TilingData LoadTilingData(const uint8_t *tiling)
{
    // The tiling tensor holds the bytes op_host's SetDataSize declared: reading more fails.
    GmRegionOf("GET_TILING_DATA", tiling, sizeof(TilingData), false);
    TilingData data;
    std::memcpy(static_cast<void *>(&data), tiling, sizeof(TilingData));
    return data;
}

}  // namespace ascendc_host

#define KERNEL_TASK_TYPE_DEFAULT(type) ::ascendc_host::DeclareTaskType(type)
// The default TilingData of the op: REGISTER_TILING_DATA_CLASS in register/tilingdata_base.h.
#define GET_TILING_DATA(tiling_data, tiling_arg) \
    const auto tiling_data =                     \
        ::ascendc_host::LoadTilingData<::optiling::DefaultTilingData>(tiling_arg)
#define TILING_KEY_IS(key) (::ascendc_host::Launch().tilingKey == static_cast<uint64_t>(key))

namespace AscendC {

__aicore__ inline int64_t GetBlockIdx() { return ascendc_host::Launch().core.blockIdx; }
__aicore__ inline int64_t GetBlockNum() { return ascendc_host::Launch().core.blockNum; }

template <pipe_t pipe>
__aicore__ inline void PipeBarrier()
{
    static_assert(pipe != PIPE_S, "PipeBarrier does not take PIPE_S");
}

template <HardEvent event>
__aicore__ inline void SetFlag(int32_t eventID)
{
    if (eventID < 0 || eventID > 7) {
        ascendc_host::Fail("SetFlag", "event ID " + std::to_string(eventID) + " outside 0..7");
    }
    ascendc_host::Launch().core.pendingFlags[static_cast<int>(event)] |= 1U << eventID;
}

template <HardEvent event>
__aicore__ inline void WaitFlag(int32_t eventID)
{
    uint8_t &pending = ascendc_host::Launch().core.pendingFlags[static_cast<int>(event)];
    if (eventID < 0 || eventID > 7 || (pending & (1U << eventID)) == 0) {
        ascendc_host::Fail("WaitFlag", "event ID " + std::to_string(eventID) +
                                           " was never set: the core would wait forever");
    }
    pending &= static_cast<uint8_t>(~(1U << eventID));
}

}  // namespace AscendC

#endif  // ASCENDC_HOST_KERNEL_ENTRY_H
