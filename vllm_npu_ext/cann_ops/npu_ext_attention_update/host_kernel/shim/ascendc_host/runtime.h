/**
 * State of one host launch of an AscendC kernel: the global-memory tensors it may address,
 * the simulated core it runs on (block index, unified buffer) and the rule checks.
 *
 * Every rule the shim enforces fails through Fail(): it throws Violation, which the launcher
 * (host_kernel/launch.cpp) turns into an error status and message, so the kernel run stops at
 * the first call that breaks a documented AscendC rule instead of reading or writing memory it
 * must not touch. Nothing here is part of AscendC's API; the API subset lives in
 * kernel_operator.h and the headers it includes.
 */
#ifndef ASCENDC_HOST_RUNTIME_H
#define ASCENDC_HOST_RUNTIME_H

#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

// AscendC's address-space and function qualifiers mean nothing on the host.
#define __aicore__
#define __global__
#define __gm__

namespace AscendC {

/** Logical positions (AscendC TPosition); the vector kernel uses the Unified Buffer ones. */
enum class TPosition : uint8_t { GM, VECIN, VECOUT, VECCALC };
using QuePosition = TPosition;

}  // namespace AscendC

namespace ascendc_host {

// Unified Buffer addresses, DataCopyPad's UB side and InitBuffer lengths are 32-byte granules
// (AscendC "通用地址对齐约束": Unified Buffer 32Byte对齐; InitBuffer rounds len up to 32 B).
constexpr uint32_t kUbBlockBytes = 32;
// What UB holds where AscendC promises nothing ("随机值"): 0xFF bytes, a NaN in fp32, fp16
// and bf16, so that a result built on such bytes cannot pass a parity check.
constexpr uint8_t kPoisonByte = 0xFF;
// Limits of the Atlas A2/A3 vector core (TPipe::InitBuffer: at most 64 buffers per kernel;
// TQue: 8 sync event IDs, so at most 8 queue buffers per TPosition).
constexpr uint32_t kMaxBuffers = 64;
constexpr uint32_t kMaxQueueBuffersPerPosition = 8;

class Violation : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

/** One global-memory tensor of the launch; the kernel may address nothing else. */
struct GmRegion {
    std::string name;
    uint8_t *base = nullptr;
    uint64_t bytes = 0;
    bool writable = false;
    std::vector<uint8_t> writes;       // per byte: UB->GM copies that wrote it (saturating)
    std::vector<uint64_t> copyBytes;   // bytes of each UB->GM copy into it, in order
};

enum class BufferKind : uint8_t { kQueue, kCalc };
// A queue buffer's life: AllocTensor -> EnQue -> DeQue -> FreeTensor (TQue documentation).
enum class SlotState : uint8_t { kFree, kAllocated, kEnqueued, kDequeued };

/** One buffer handed out by TPipe::InitBuffer: a slot of a TQue, or a TBuf. */
struct UbBuffer {
    uint32_t offset = 0;  // bytes from the start of the core's UB
    uint32_t bytes = 0;   // InitBuffer's len rounded up to 32 bytes
    AscendC::TPosition position = AscendC::TPosition::VECCALC;
    BufferKind kind = BufferKind::kCalc;
    SlotState state = SlotState::kFree;
};

/** One simulated vector core: its block index and its own Unified Buffer. */
struct CoreState {
    int64_t blockIdx = 0;
    int64_t blockNum = 1;
    std::vector<uint8_t> ub;
    uint32_t ubUsed = 0;
    std::vector<std::unique_ptr<UbBuffer>> buffers;
    void *pipe = nullptr;        // the core's TPipe (GetTPipePtr)
    uint8_t pendingFlags[16] = {};  // per HardEvent: bit i set by SetFlag(i), cleared by WaitFlag
};

struct LaunchState {
    uint64_t tilingKey = 0;
    int taskType = -1;  // KERNEL_TASK_TYPE_DEFAULT's argument, -1 when never declared
    std::vector<GmRegion> gm;
    CoreState core;
    uint32_t ubPeak = 0;
};

/** The launch running on this thread (one instance across translation units). */
inline LaunchState &Launch()
{
    static thread_local LaunchState state;
    return state;
}

[[noreturn]] inline void Fail(const std::string &api, const std::string &rule)
{
    throw Violation(api + ": " + rule + " (core " + std::to_string(Launch().core.blockIdx) + ")");
}

inline uint64_t AlignUp(uint64_t value, uint64_t alignment)
{
    return (value + alignment - 1) / alignment * alignment;
}

/** A fresh core `blockIdx` of `blockNum` with `ubBytes` of poisoned UB (nothing allocated). */
inline void BeginCore(int64_t blockIdx, int64_t blockNum, uint64_t ubBytes)
{
    CoreState &core = Launch().core;
    core.blockIdx = blockIdx;
    core.blockNum = blockNum;
    core.ub.assign(ubBytes, kPoisonByte);
    core.ubUsed = 0;
    core.buffers.clear();
    core.pipe = nullptr;
    std::memset(core.pendingFlags, 0, sizeof(core.pendingFlags));
}

/** `bytes` (rounded up to 32) of the current core's UB for one buffer, or a violation. */
inline UbBuffer *AllocateUb(const char *api, uint32_t bytes, AscendC::TPosition position,
                            BufferKind kind)
{
    CoreState &core = Launch().core;
    if (core.buffers.size() >= kMaxBuffers) {
        Fail(api, "more than " + std::to_string(kMaxBuffers) + " buffers in one kernel");
    }
    const uint64_t aligned = AlignUp(bytes, kUbBlockBytes);
    if (core.ubUsed + aligned > core.ub.size()) {
        Fail(api, "unified buffer overflow: " + std::to_string(core.ubUsed + aligned) +
                      " bytes needed, the core has " + std::to_string(core.ub.size()));
    }
    auto buffer = std::make_unique<UbBuffer>();
    buffer->offset = core.ubUsed;
    buffer->bytes = static_cast<uint32_t>(aligned);
    buffer->position = position;
    buffer->kind = kind;
    core.ubUsed += static_cast<uint32_t>(aligned);
    if (core.ubUsed > Launch().ubPeak) {
        Launch().ubPeak = core.ubUsed;
    }
    core.buffers.push_back(std::move(buffer));
    return core.buffers.back().get();
}

inline uint8_t *UbAt(uint32_t offset) { return Launch().core.ub.data() + offset; }

/** The launch tensor holding [address, address + bytes), or a violation. */
inline GmRegion &GmRegionOf(const char *api, const uint8_t *address, uint64_t bytes, bool write)
{
    const auto at = reinterpret_cast<uintptr_t>(address);
    for (GmRegion &region : Launch().gm) {
        const auto base = reinterpret_cast<uintptr_t>(region.base);
        if (at >= base && at < base + region.bytes) {
            const uint64_t start = at - base;
            if (start + bytes > region.bytes) {
                Fail(api, "global memory access of " + std::to_string(bytes) + " bytes at byte " +
                              std::to_string(start) + " runs past the end of tensor " +
                              region.name + " (" + std::to_string(region.bytes) + " bytes)");
            }
            if (write && !region.writable) {
                Fail(api, "writes input tensor " + region.name);
            }
            return region;
        }
    }
    Fail(api, "global memory address outside every tensor of the launch");
}

}  // namespace ascendc_host

#endif  // ASCENDC_HOST_RUNTIME_H
