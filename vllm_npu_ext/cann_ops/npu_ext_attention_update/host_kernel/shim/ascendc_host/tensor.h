/**
 * GlobalTensor and LocalTensor on the host, and the checks every access goes through.
 *
 * GlobalTensor (SetGlobalBuffer, operator[]): a typed address in one of the launch's GM
 * tensors with the element count the kernel declared; an access must stay inside both.
 * LocalTensor (from TQue::AllocTensor/DeQue or TBuf::Get, operator[], GetValue): a range of
 * one UB buffer; an access must stay inside that buffer ("offset不能超过原有LocalTensor的size").
 *
 * Which unit may touch a queue buffer when follows the TPipe/TQue synchronisation that
 * EnQue/DeQue insert (AscendC 核内同步, "TPipe-TQue框架编程范式自动同步": MTE2->V, V->MTE3):
 *   GM->UB copy (MTE2) writes a queue tensor between AllocTensor and EnQue;
 *   the vector unit reads a VECIN tensor after DeQue, writes a VECOUT one before EnQue;
 *   UB->GM copy (MTE3) reads a queue tensor after DeQue.
 * TBuf (VECCALC) buffers are vector/scalar only; copies into or out of them would need
 * manual SetFlag/WaitFlag between pipes, which the shim does not model, so they fail.
 */
#ifndef ASCENDC_HOST_TENSOR_H
#define ASCENDC_HOST_TENSOR_H

#include <cstdint>
#include <string>

#include "ascendc_host/runtime.h"

namespace ascendc_host {

enum class Unit : uint8_t { kCopyIn, kVector, kScalar, kCopyOut };

inline const char *StateName(SlotState state)
{
    switch (state) {
        case SlotState::kFree: return "free (before AllocTensor or after FreeTensor)";
        case SlotState::kAllocated: return "allocated (after AllocTensor, before EnQue)";
        case SlotState::kEnqueued: return "enqueued (after EnQue, before DeQue)";
        default: return "dequeued (after DeQue)";
    }
}

/** Whether `unit` may use `buffer` now, per the queue synchronisation above. */
inline void CheckPipeAccess(const char *api, const UbBuffer &buffer, Unit unit)
{
    using AscendC::TPosition;
    if (buffer.kind == BufferKind::kCalc) {
        if (unit == Unit::kCopyIn || unit == Unit::kCopyOut) {
            Fail(api, "copies a TBuf: only queue tensors are synchronised with the copy units");
        }
        return;
    }
    bool allowed = false;
    switch (unit) {
        case Unit::kCopyIn: allowed = buffer.state == SlotState::kAllocated; break;
        case Unit::kCopyOut: allowed = buffer.state == SlotState::kDequeued; break;
        default:
            allowed = buffer.position == TPosition::VECIN ? buffer.state == SlotState::kDequeued
                                                          : buffer.state == SlotState::kAllocated;
    }
    if (!allowed) {
        Fail(api, std::string("uses a queue tensor that is ") + StateName(buffer.state) +
                      ": EnQue/DeQue must hand it over between the copy and vector units");
    }
}

}  // namespace ascendc_host

namespace AscendC {

template <typename T>
class GlobalTensor {
public:
    __aicore__ inline GlobalTensor() {}

    __aicore__ inline void SetGlobalBuffer(__gm__ T *buffer, uint64_t bufferSize)
    {
        base_ = reinterpret_cast<uint8_t *>(buffer);
        offset_ = 0;
        size_ = bufferSize;
    }

    /** Elements are counted from the bound address; the access checks the bound. */
    __aicore__ inline GlobalTensor operator[](uint64_t offset) const
    {
        GlobalTensor view = *this;
        view.offset_ += offset;
        return view;
    }

    /** Host address of bytes [byteOffset, byteOffset + bytes) of this view, checked. */
    uint8_t *Bytes(const char *api, uint64_t byteOffset, uint64_t bytes, bool write) const
    {
        if (base_ == nullptr) {
            ascendc_host::Fail(api, "GlobalTensor without SetGlobalBuffer (or a null address)");
        }
        const uint64_t start = offset_ * sizeof(T) + byteOffset;
        if (start + bytes > size_ * sizeof(T)) {
            ascendc_host::Fail(api, "global memory access [" + std::to_string(start) + ", " +
                                        std::to_string(start + bytes) +
                                        ") bytes past the GlobalTensor's declared " +
                                        std::to_string(size_ * sizeof(T)) + " bytes");
        }
        ascendc_host::GmRegionOf(api, base_ + start, bytes, write);
        return base_ + start;
    }

private:
    uint8_t *base_ = nullptr;
    uint64_t offset_ = 0;  // elements
    uint64_t size_ = 0;    // elements, as declared by SetGlobalBuffer
};

template <typename T>
class LocalTensor {
public:
    __aicore__ inline LocalTensor() {}
    LocalTensor(ascendc_host::UbBuffer *buffer, uint32_t offset, uint32_t bytes)
        : buffer_(buffer), offset_(offset), bytes_(bytes)
    {
    }

    __aicore__ inline LocalTensor operator[](uint32_t offset) const
    {
        const uint64_t bytes = static_cast<uint64_t>(offset) * sizeof(T);
        if (buffer_ == nullptr || bytes > bytes_) {
            ascendc_host::Fail("LocalTensor::operator[]",
                               "offset " + std::to_string(offset) + " is past the tensor's " +
                                   std::to_string(GetSize()) + " elements");
        }
        return LocalTensor(buffer_, offset_ + static_cast<uint32_t>(bytes),
                           bytes_ - static_cast<uint32_t>(bytes));
    }

    /** A scalar read (PIPE_S) of element `index`. */
    __aicore__ inline T GetValue(uint32_t index) const
    {
        T value;
        std::memcpy(&value, Access("LocalTensor::GetValue", index, 1, ascendc_host::Unit::kScalar),
                    sizeof(T));
        return value;
    }

    __aicore__ inline uint32_t GetSize() const { return bytes_ / sizeof(T); }

    /**
     * Host address of elements [first, first + count), checked: a tensor from a TQue/TBuf,
     * inside its buffer, the start 32-byte aligned for every unit but the scalar one, and
     * the unit allowed to use the buffer now.
     */
    uint8_t *Access(const char *api, uint64_t first, uint64_t count, ascendc_host::Unit unit) const
    {
        if (buffer_ == nullptr) {
            ascendc_host::Fail(api, "LocalTensor that no TQue or TBuf handed out");
        }
        const uint64_t start = first * sizeof(T);
        if (start + count * sizeof(T) > bytes_) {
            ascendc_host::Fail(api, "UB access of " + std::to_string(count) +
                                        " elements from element " + std::to_string(first) +
                                        " overruns the tensor's " + std::to_string(GetSize()));
        }
        const uint32_t address = offset_ + static_cast<uint32_t>(start);
        if (unit != ascendc_host::Unit::kScalar && address % ascendc_host::kUbBlockBytes != 0) {
            ascendc_host::Fail(api, "UB operand at byte " + std::to_string(address) +
                                        " is not 32-byte aligned");
        }
        ascendc_host::CheckPipeAccess(api, *buffer_, unit);
        return ascendc_host::UbAt(address);
    }

    ascendc_host::UbBuffer *Buffer() const { return buffer_; }
    uint32_t UbOffset() const { return offset_; }

private:
    ascendc_host::UbBuffer *buffer_ = nullptr;
    uint32_t offset_ = 0;  // bytes from the start of UB
    uint32_t bytes_ = 0;   // bytes from offset_ to the end of the buffer
};

}  // namespace AscendC

#endif  // ASCENDC_HOST_TENSOR_H
