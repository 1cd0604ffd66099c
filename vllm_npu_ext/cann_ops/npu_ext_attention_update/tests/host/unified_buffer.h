/**
 * One AI core's unified buffer (UB) on the host, for the CPU twin.
 *
 * Buffers are allocated one after another, each rounded up to 32 bytes, as AscendC's TPipe
 * does; allocating past the capacity throws, so a tiling whose buffers do not fit fails
 * loudly. Every access is bounds-checked against its buffer and must start on a 32-byte
 * boundary, as DMA and vector instructions on the NPU require.
 */
#ifndef NPU_EXT_ATTENTION_UPDATE_UNIFIED_BUFFER_H
#define NPU_EXT_ATTENTION_UPDATE_UNIFIED_BUFFER_H

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "attention_update_tiling_math.h"

namespace npu_ext_au {

class UnifiedBuffer {
public:
    /** A buffer of `copies` equal parts (a queue has kBufferNum of them). */
    struct Slot {
        uint64_t offset = 0;
        uint64_t bytesPerCopy = 0;
        uint32_t copies = 0;
    };

    explicit UnifiedBuffer(uint64_t capacity)
        : storage_(capacity / sizeof(uint64_t) + 1), capacity_(capacity)
    {
    }

    Slot Allocate(uint64_t bytes, uint32_t copies)
    {
        Slot slot{used_, AlignUp(bytes, kUbBlockBytes), copies};
        used_ += slot.bytesPerCopy * copies;
        if (used_ > capacity_) {
            throw std::runtime_error("UB overflow: " + std::to_string(used_) + " bytes needed, " +
                                     std::to_string(capacity_) + " available");
        }
        return slot;
    }

    /** `count` elements of T at element `offset` of copy `copy` of `slot`. */
    template <typename T>
    T *Get(const Slot &slot, uint32_t copy, uint64_t offset, uint64_t count)
    {
        const uint64_t byteOffset = offset * sizeof(T);
        if (copy >= slot.copies || byteOffset + count * sizeof(T) > slot.bytesPerCopy) {
            throw std::out_of_range("UB access outside its buffer");
        }
        if (byteOffset % kUbBlockBytes != 0) {
            throw std::runtime_error("UB access not 32-byte aligned");
        }
        auto *base = reinterpret_cast<uint8_t *>(storage_.data());
        return reinterpret_cast<T *>(base + slot.offset + copy * slot.bytesPerCopy + byteOffset);
    }

    uint64_t Used() const { return used_; }

private:
    std::vector<uint64_t> storage_;  // 8-byte aligned backing store
    uint64_t capacity_;
    uint64_t used_ = 0;
};

}  // namespace npu_ext_au

#endif  // NPU_EXT_ATTENTION_UPDATE_UNIFIED_BUFFER_H
