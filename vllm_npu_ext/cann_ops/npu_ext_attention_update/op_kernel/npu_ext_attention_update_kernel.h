/**
 * NpuExtAttentionUpdate AscendC kernel (ascend910b, ascend910_93; vector cores only).
 *
 * Inputs  lse fp32 [sp, N], go T [sp, N, D]    (T = float, half or bfloat16_t)
 * Outputs out T [N, D], lse_out fp32 [N]       (lse_out only written when update_type == 1)
 *
 * Per row r, over the sp shards (aclnnAttentionUpdate's math; the PyTorch reference's guards):
 *   m        = max(max_i lse_i[r], lowest float)     (an all-empty row must not give NaN)
 *   w_i      = exp(lse_i[r] - m)
 *   total    = sum_i w_i
 *   lse_out  = m + ln(total)                         (-inf for an all-empty row)
 *   scale_i  = w_i / max(total, smallest normal)
 *   out[r]   = sum_i scale_i * go_i[r]   over the shards with scale_i > 0, in fp32
 *
 * Global buffers are bound once in Init; shard i of a tile is addressed by offset
 * (attention_update_tiling_math.h: i * N + coreStart + progress * tileLength, times D for go).
 * CANN's toolchain builds it for the NPU; g++ builds this same file for the host against
 * host_kernel/shim/ (a stand-in for the AscendC calls below that checks their documented
 * rules), and the tests and the torch_npu emulator run it on every simulated vector core.
 */
#ifndef NPU_EXT_ATTENTION_UPDATE_KERNEL_H
#define NPU_EXT_ATTENTION_UPDATE_KERNEL_H

#include "kernel_operator.h"
#include "attention_update_tiling_math.h"

namespace npu_ext_au {

using namespace AscendC;

constexpr float kLowestFloat = -3.40282347e+38f;
constexpr float kSmallestNormalFloat = 1.17549435e-38f;

template <typename GoT>
class AttentionUpdateKernel {
public:
    static constexpr bool kGoIsFloat = sizeof(GoT) == sizeof(float);

    __aicore__ inline AttentionUpdateKernel() {}

    __aicore__ inline void Init(GM_ADDR lse, GM_ADDR go, GM_ADDR out, GM_ADDR lseOut,
                                const AttentionUpdateTiling &tiling)
    {
        tiling_ = tiling;
        const CoreRows core = RowsOfCore(tiling_, static_cast<uint32_t>(GetBlockIdx()));
        coreStart_ = core.start;
        coreRows_ = core.rows;
        // Each tensor is bound once, whole; shards are reached by offset, not by re-binding.
        const uint64_t shardRows = static_cast<uint64_t>(tiling_.sp) * tiling_.totalLength;
        lseGm_.SetGlobalBuffer(reinterpret_cast<__gm__ float *>(lse), shardRows);
        goGm_.SetGlobalBuffer(reinterpret_cast<__gm__ GoT *>(go), shardRows * tiling_.hDim);
        outGm_.SetGlobalBuffer(reinterpret_cast<__gm__ GoT *>(out),
                               static_cast<uint64_t>(tiling_.totalLength) * tiling_.hDim);
        lseOutGm_.SetGlobalBuffer(reinterpret_cast<__gm__ float *>(lseOut), tiling_.totalLength);
        InitUnifiedBuffer();
    }

    __aicore__ inline void Process()
    {
        if (static_cast<uint32_t>(GetBlockIdx()) >= tiling_.usedCoreNum) {
            return;
        }
        const uint32_t tiles = TileCount(coreRows_, tiling_.tileLength);
        for (uint32_t progress = 0; progress < tiles; ++progress) {
            const uint32_t rows = RowsOfTile(coreRows_, tiling_.tileLength, progress);
            CopyIn(progress, rows);
            Compute(rows);
            CopyOut(progress, rows);
        }
    }

private:
    __aicore__ inline void InitUnifiedBuffer()
    {
        // The byte counts come from the shared header, which the host tiling used to make
        // sure that all of them together fit in the unified buffer.
        UbBuffers bytes;
        UbBytesOfTile(tiling_.sp, tiling_.hDim, tiling_.goElemBytes, tiling_.tileLength, &bytes);
        pipe_.InitBuffer(lseInQueue_, kBufferNum, bytes.lseIn);
        pipe_.InitBuffer(goInQueue_, kBufferNum, bytes.goIn);
        pipe_.InitBuffer(outQueue_, kBufferNum, bytes.out);
        pipe_.InitBuffer(lseOutQueue_, kBufferNum, bytes.lseOut);
        pipe_.InitBuffer(lseMaxBuf_, bytes.lseMax);
        pipe_.InitBuffer(totalBuf_, bytes.lseSum);
        pipe_.InitBuffer(weightsBuf_, bytes.weights);
        if constexpr (!kGoIsFloat) {
            pipe_.InitBuffer(goFloatBuf_, bytes.goFloat);
            pipe_.InitBuffer(accBuf_, bytes.acc);
        }
    }

    /** Strided CopyIn: the `rows` rows of every shard of tile `progress`, lse padded with 0. */
    __aicore__ inline void CopyIn(uint32_t progress, uint32_t rows)
    {
        LocalTensor<float> lseLocal = lseInQueue_.AllocTensor<float>();
        LocalTensor<GoT> goLocal = goInQueue_.AllocTensor<GoT>();
        const uint8_t lsePadding = static_cast<uint8_t>(AlignedRows(rows) - rows);
        const DataCopyExtParams lseCopy{1, rows * kLseElemBytes, 0, 0, 0};
        const DataCopyPadExtParams<float> lsePad{true, 0, lsePadding, 0.0f};
        const DataCopyExtParams goCopy{1, rows * tiling_.hDim * static_cast<uint32_t>(sizeof(GoT)),
                                       0, 0, 0};
        const DataCopyPadExtParams<GoT> goPad{false, 0, 0, 0};
        for (uint32_t shard = 0; shard < tiling_.sp; ++shard) {
            DataCopyPad(lseLocal[LseLocalOffset(tiling_, shard)],
                        lseGm_[LseGmOffset(tiling_, shard, coreStart_, progress)], lseCopy, lsePad);
            DataCopyPad(goLocal[GoLocalOffset(tiling_, shard)],
                        goGm_[GoGmOffset(tiling_, shard, coreStart_, progress)], goCopy, goPad);
        }
        lseInQueue_.EnQue(lseLocal);
        goInQueue_.EnQue(goLocal);
    }

    __aicore__ inline void Compute(uint32_t rows)
    {
        LocalTensor<float> lseLocal = lseInQueue_.DeQue<float>();
        LocalTensor<GoT> goLocal = goInQueue_.DeQue<GoT>();
        LocalTensor<GoT> outLocal = outQueue_.AllocTensor<GoT>();
        LocalTensor<float> lseOutLocal = lseOutQueue_.AllocTensor<float>();

        ComputeScales(lseLocal, lseOutLocal, AlignedRows(rows));
        LocalTensor<float> acc = Accumulator(outLocal);
        Duplicate(acc, 0.0f, rows * tiling_.hDim);
        PipeBarrier<PIPE_V>();
        AccumulateShards(goLocal, acc, rows);
        if constexpr (!kGoIsFloat) {
            Cast(outLocal, acc, RoundMode::CAST_RINT, rows * tiling_.hDim);
        }

        outQueue_.EnQue(outLocal);
        lseOutQueue_.EnQue(lseOutLocal);
        lseInQueue_.FreeTensor(lseLocal);
        goInQueue_.FreeTensor(goLocal);
    }

    /** weights_ <- scale_i per shard and row; lseOut <- merged lse. `lanes` = AlignedRows. */
    __aicore__ inline void ComputeScales(const LocalTensor<float> &lse,
                                         const LocalTensor<float> &lseOut, uint32_t lanes)
    {
        LocalTensor<float> lseMax = lseMaxBuf_.Get<float>();
        LocalTensor<float> total = totalBuf_.Get<float>();
        LocalTensor<float> weights = weightsBuf_.Get<float>();
        Adds(lseMax, lse, 0.0f, lanes);
        PipeBarrier<PIPE_V>();
        for (uint32_t shard = 1; shard < tiling_.sp; ++shard) {
            Max(lseMax, lseMax, lse[LseLocalOffset(tiling_, shard)], lanes);
            PipeBarrier<PIPE_V>();
        }
        Maxs(lseMax, lseMax, kLowestFloat, lanes);
        PipeBarrier<PIPE_V>();
        for (uint32_t shard = 0; shard < tiling_.sp; ++shard) {
            const uint32_t at = LseLocalOffset(tiling_, shard);
            Sub(weights[at], lse[at], lseMax, lanes);
            PipeBarrier<PIPE_V>();
            Exp(weights[at], weights[at], lanes);
        }
        PipeBarrier<PIPE_V>();
        Adds(total, weights, 0.0f, lanes);
        PipeBarrier<PIPE_V>();
        for (uint32_t shard = 1; shard < tiling_.sp; ++shard) {
            Add(total, total, weights[LseLocalOffset(tiling_, shard)], lanes);
            PipeBarrier<PIPE_V>();
        }
        Ln(lseOut, total, lanes);
        PipeBarrier<PIPE_V>();
        Add(lseOut, lseOut, lseMax, lanes);
        // An all-empty row has total 0 and weights 0: divide by the smallest normal, get 0.
        Maxs(total, total, kSmallestNormalFloat, lanes);
        PipeBarrier<PIPE_V>();
        for (uint32_t shard = 0; shard < tiling_.sp; ++shard) {
            const uint32_t at = LseLocalOffset(tiling_, shard);
            Div(weights[at], weights[at], total, lanes);
        }
        PipeBarrier<PIPE_V>();
    }

    /** acc[r] += scale_i[r] * go_i[r] for every shard, skipping rows whose scale is 0. */
    __aicore__ inline void AccumulateShards(const LocalTensor<GoT> &goLocal,
                                            const LocalTensor<float> &acc, uint32_t rows)
    {
        LocalTensor<float> weights = weightsBuf_.Get<float>();
        // The scales are read by the scalar unit: wait for the vector unit to write them.
        const event_t vectorToScalar =
            static_cast<event_t>(GetTPipePtr()->FetchEventID(HardEvent::V_S));
        SetFlag<HardEvent::V_S>(vectorToScalar);
        WaitFlag<HardEvent::V_S>(vectorToScalar);
        const uint32_t hDim = tiling_.hDim;
        for (uint32_t shard = 0; shard < tiling_.sp; ++shard) {
            LocalTensor<float> values = ShardAsFloat(goLocal, shard, rows);
            const uint32_t scaleAt = LseLocalOffset(tiling_, shard);
            for (uint32_t row = 0; row < rows; ++row) {
                const float scale = weights.GetValue(scaleAt + row);
                // A zero weight must not let a non-finite partial output through (0 * inf).
                if (scale > 0.0f) {
                    Axpy(acc[row * hDim], values[row * hDim], scale, hDim);
                }
            }
            PipeBarrier<PIPE_V>();
        }
    }

    /** Shard `shard` of the go tile as fp32: in place for fp32, cast into goFloat otherwise. */
    __aicore__ inline LocalTensor<float> ShardAsFloat(const LocalTensor<GoT> &goLocal,
                                                      uint32_t shard, uint32_t rows)
    {
        if constexpr (kGoIsFloat) {
            return goLocal[GoLocalOffset(tiling_, shard)];
        } else {
            LocalTensor<float> values = goFloatBuf_.Get<float>();
            Cast(values, goLocal[GoLocalOffset(tiling_, shard)], RoundMode::CAST_NONE,
                 rows * tiling_.hDim);
            PipeBarrier<PIPE_V>();
            return values;
        }
    }

    /** Where the fp32 sum lives: the output tile itself for fp32, a separate buffer otherwise. */
    __aicore__ inline LocalTensor<float> Accumulator(const LocalTensor<GoT> &outLocal)
    {
        if constexpr (kGoIsFloat) {
            return outLocal;
        } else {
            return accBuf_.Get<float>();
        }
    }

    __aicore__ inline void CopyOut(uint32_t progress, uint32_t rows)
    {
        LocalTensor<GoT> outLocal = outQueue_.DeQue<GoT>();
        const DataCopyExtParams outCopy{
            1, rows * tiling_.hDim * static_cast<uint32_t>(sizeof(GoT)), 0, 0, 0};
        DataCopyPad(outGm_[OutGmOffset(tiling_, coreStart_, progress)], outLocal, outCopy);
        outQueue_.FreeTensor(outLocal);

        LocalTensor<float> lseOutLocal = lseOutQueue_.DeQue<float>();
        if (tiling_.updateType == 1) {
            const DataCopyExtParams lseOutCopy{1, rows * kLseElemBytes, 0, 0, 0};
            DataCopyPad(lseOutGm_[LseOutGmOffset(tiling_, coreStart_, progress)], lseOutLocal,
                        lseOutCopy);
        }
        lseOutQueue_.FreeTensor(lseOutLocal);
    }

    TPipe pipe_;
    TQue<QuePosition::VECIN, kBufferNum> lseInQueue_;
    TQue<QuePosition::VECIN, kBufferNum> goInQueue_;
    TQue<QuePosition::VECOUT, kBufferNum> outQueue_;
    TQue<QuePosition::VECOUT, kBufferNum> lseOutQueue_;
    TBuf<QuePosition::VECCALC> lseMaxBuf_;
    TBuf<QuePosition::VECCALC> totalBuf_;
    TBuf<QuePosition::VECCALC> weightsBuf_;
    TBuf<QuePosition::VECCALC> goFloatBuf_;
    TBuf<QuePosition::VECCALC> accBuf_;

    GlobalTensor<float> lseGm_;
    GlobalTensor<GoT> goGm_;
    GlobalTensor<GoT> outGm_;
    GlobalTensor<float> lseOutGm_;

    AttentionUpdateTiling tiling_;
    uint32_t coreStart_ = 0;
    uint32_t coreRows_ = 0;
};

}  // namespace npu_ext_au

#endif  // NPU_EXT_ATTENTION_UPDATE_KERNEL_H
