/**
 * TPipe, TQue and TBuf on the host: the core's UB handed out as plain buffers, with the
 * documented rules that keep a kernel's buffers sound (AscendC 资源管理: TPipe::InitBuffer,
 * TQue AllocTensor/EnQue/DeQue/FreeTensor, TBuf::Get):
 *   - InitBuffer rounds each length up to 32 bytes and places buffers one after another; the
 *     total must fit the core's UB, at most 64 buffers, at most 8 queue buffers per position;
 *   - AllocTensor hands out a free buffer of the queue (its content is undefined: poisoned
 *     here) and fails when every buffer is in use; EnQue takes a tensor the queue allocated,
 *     at most `depth` in a row; DeQue of an empty queue fails ("异常行为"); FreeTensor returns
 *     an allocated or dequeued tensor;
 *   - TBuf::Get(len) may not exceed the length given to InitBuffer; its content persists.
 */
#ifndef ASCENDC_HOST_PIPE_H
#define ASCENDC_HOST_PIPE_H

#include <algorithm>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "ascendc_host/runtime.h"
#include "ascendc_host/tensor.h"

namespace AscendC {

enum class HardEvent : uint8_t { MTE2_V, V_MTE2, MTE3_V, V_MTE3, V_S, S_V, MTE2_S, MTE3_S };
using TEventID = int8_t;

template <TPosition pos, int32_t depth>
class TQue {
    static_assert(pos == TPosition::VECIN || pos == TPosition::VECOUT,
                  "the host shim models vector-core queues (VECIN, VECOUT) only");
    static_assert(depth >= 1, "the host shim models non-inplace queues (depth >= 1) only");

public:
    template <typename T>
    __aicore__ inline LocalTensor<T> AllocTensor()
    {
        for (size_t tried = 0; tried < slots_.size(); ++tried) {
            ascendc_host::UbBuffer *slot = slots_[(next_ + tried) % slots_.size()];
            if (slot->state == ascendc_host::SlotState::kFree) {
                next_ = (next_ + tried + 1) % slots_.size();
                slot->state = ascendc_host::SlotState::kAllocated;
                std::fill_n(ascendc_host::UbAt(slot->offset), slot->bytes,
                            ascendc_host::kPoisonByte);
                return LocalTensor<T>(slot, slot->offset, slot->bytes);
            }
        }
        ascendc_host::Fail("TQue::AllocTensor",
                           slots_.empty() ? "queue without InitBuffer"
                                          : "every buffer of the queue is allocated or enqueued "
                                            "(a FreeTensor is missing)");
    }

    template <typename T>
    __aicore__ inline bool EnQue(const LocalTensor<T> &tensor)
    {
        ascendc_host::UbBuffer *slot = SlotOf("TQue::EnQue", tensor);
        if (slot->state != ascendc_host::SlotState::kAllocated) {
            ascendc_host::Fail("TQue::EnQue", std::string("tensor is ") +
                                                  ascendc_host::StateName(slot->state));
        }
        if (fifo_.size() >= static_cast<size_t>(depth)) {
            ascendc_host::Fail("TQue::EnQue", "more than depth=" + std::to_string(depth) +
                                                  " EnQue without a DeQue");
        }
        slot->state = ascendc_host::SlotState::kEnqueued;
        fifo_.push_back(slot);
        return true;
    }

    template <typename T>
    __aicore__ inline LocalTensor<T> DeQue()
    {
        if (fifo_.empty()) {
            ascendc_host::Fail("TQue::DeQue", "DeQue of an empty queue");
        }
        ascendc_host::UbBuffer *slot = fifo_.front();
        fifo_.pop_front();
        slot->state = ascendc_host::SlotState::kDequeued;
        return LocalTensor<T>(slot, slot->offset, slot->bytes);
    }

    template <typename T>
    __aicore__ inline void FreeTensor(LocalTensor<T> &tensor)
    {
        ascendc_host::UbBuffer *slot = SlotOf("TQue::FreeTensor", tensor);
        if (slot->state != ascendc_host::SlotState::kAllocated &&
            slot->state != ascendc_host::SlotState::kDequeued) {
            ascendc_host::Fail("TQue::FreeTensor", std::string("tensor is ") +
                                                       ascendc_host::StateName(slot->state));
        }
        slot->state = ascendc_host::SlotState::kFree;
    }

    /** TPipe::InitBuffer's side: the queue's buffers. */
    void Attach(std::vector<ascendc_host::UbBuffer *> slots)
    {
        if (!slots_.empty()) {
            ascendc_host::Fail("TPipe::InitBuffer", "queue initialised twice");
        }
        slots_ = std::move(slots);
    }

private:
    template <typename T>
    ascendc_host::UbBuffer *SlotOf(const char *api, const LocalTensor<T> &tensor) const
    {
        ascendc_host::UbBuffer *slot = tensor.Buffer();
        if (std::find(slots_.begin(), slots_.end(), slot) == slots_.end() ||
            tensor.UbOffset() != slot->offset) {
            ascendc_host::Fail(api, "tensor is not one this queue handed out");
        }
        return slot;
    }

    std::vector<ascendc_host::UbBuffer *> slots_;
    std::deque<ascendc_host::UbBuffer *> fifo_;
    size_t next_ = 0;
};

template <TPosition pos = TPosition::VECCALC>
class TBuf {
public:
    template <typename T>
    __aicore__ inline LocalTensor<T> Get() const
    {
        return Get<T>(Buffer()->bytes / sizeof(T));
    }

    template <typename T>
    __aicore__ inline LocalTensor<T> Get(uint32_t len) const
    {
        ascendc_host::UbBuffer *buffer = Buffer();
        if (static_cast<uint64_t>(len) * sizeof(T) > buffer->bytes) {
            ascendc_host::Fail("TBuf::Get", std::to_string(len) + " elements exceed the " +
                                                std::to_string(buffer->bytes) + " buffer bytes");
        }
        return LocalTensor<T>(buffer, buffer->offset, static_cast<uint32_t>(len * sizeof(T)));
    }

    void Attach(ascendc_host::UbBuffer *buffer)
    {
        if (buffer_ != nullptr) {
            ascendc_host::Fail("TPipe::InitBuffer", "TBuf initialised twice");
        }
        buffer_ = buffer;
    }

private:
    ascendc_host::UbBuffer *Buffer() const
    {
        if (buffer_ == nullptr) {
            ascendc_host::Fail("TBuf::Get", "TBuf without InitBuffer");
        }
        return buffer_;
    }

    ascendc_host::UbBuffer *buffer_ = nullptr;
};

class TPipe {
public:
    __aicore__ inline TPipe() { ascendc_host::Launch().core.pipe = this; }
    __aicore__ inline ~TPipe()
    {
        if (ascendc_host::Launch().core.pipe == this) {
            ascendc_host::Launch().core.pipe = nullptr;
        }
    }
    TPipe(const TPipe &) = delete;
    TPipe &operator=(const TPipe &) = delete;

    template <TPosition pos, int32_t depth>
    __aicore__ inline bool InitBuffer(TQue<pos, depth> &que, uint8_t num, uint32_t len)
    {
        uint32_t sameQueuePosition = 0;
        for (const auto &buffer : ascendc_host::Launch().core.buffers) {
            sameQueuePosition += buffer->kind == ascendc_host::BufferKind::kQueue &&
                                 buffer->position == pos;
        }
        if (num < 1 || sameQueuePosition + num > ascendc_host::kMaxQueueBuffersPerPosition) {
            ascendc_host::Fail("TPipe::InitBuffer",
                               std::to_string(num) + " queue buffers: a position has at most " +
                                   std::to_string(ascendc_host::kMaxQueueBuffersPerPosition));
        }
        std::vector<ascendc_host::UbBuffer *> slots;
        for (uint8_t i = 0; i < num; ++i) {
            slots.push_back(ascendc_host::AllocateUb("TPipe::InitBuffer", len, pos,
                                                     ascendc_host::BufferKind::kQueue));
        }
        que.Attach(std::move(slots));
        return true;
    }

    template <TPosition pos>
    __aicore__ inline bool InitBuffer(TBuf<pos> &buf, uint32_t len)
    {
        buf.Attach(ascendc_host::AllocateUb("TPipe::InitBuffer", len, pos,
                                            ascendc_host::BufferKind::kCalc));
        return true;
    }

    /** An event ID of `event` that no SetFlag holds now ("仅提供可用的TEventID"). */
    __aicore__ inline TEventID FetchEventID(HardEvent event) const
    {
        const uint8_t pending = ascendc_host::Launch().core.pendingFlags[static_cast<int>(event)];
        for (TEventID id = 0; id < 8; ++id) {
            if ((pending & (1U << id)) == 0) {
                return id;
            }
        }
        ascendc_host::Fail("TPipe::FetchEventID", "all 8 event IDs are set and not waited for");
    }
};

__aicore__ inline TPipe *GetTPipePtr()
{
    auto *pipe = static_cast<TPipe *>(ascendc_host::Launch().core.pipe);
    if (pipe == nullptr) {
        ascendc_host::Fail("GetTPipePtr", "no TPipe on this core");
    }
    return pipe;
}

}  // namespace AscendC

#endif  // ASCENDC_HOST_PIPE_H
