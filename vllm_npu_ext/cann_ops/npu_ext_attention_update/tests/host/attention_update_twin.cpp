/**
 * CPU twin of the NpuExtAttentionUpdate kernel (op_kernel/npu_ext_attention_update_kernel.h).
 *
 * Same tiling (ComputeTiling), same core/tile walk, same strided CopyIn offsets, same UB
 * layout (a bounds-checked host UB per core), and the same fp32 operations in the same order
 * (max, clamp, exp, sum, ln, divide, per-row axpy skipping zero scales, round to nearest
 * even). Built as a shared library; the Python tests feed it random data through ctypes and
 * compare it with the golden reference and with vllm_npu_ext.ops.attention_update.
 *
 * What it cannot show: AscendC API semantics, pipe synchronisation, DMA behaviour and the
 * NPU's exp/ln accuracy. Those need an Ascend machine.
 */
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <exception>
#include <memory>
#include <string>

#include "attention_update_tiling_math.h"
#include "float_codecs.h"
#include "tile_walk.h"
#include "unified_buffer.h"

namespace npu_ext_au {
namespace {

constexpr float kLowestFloat = -FLT_MAX;
constexpr float kSmallestNormalFloat = FLT_MIN;

template <typename Codec>
class TwinKernel {
public:
    using GoT = typename Codec::Storage;

    TwinKernel(const AttentionUpdateTiling &tiling, uint64_t ubBytes, const float *lse,
               const GoT *go, GoT *out, float *lseOut)
        : tiling_(tiling), ubBytes_(ubBytes), lseGm_(lse), goGm_(go), outGm_(out), lseOutGm_(lseOut)
    {
    }

    /** A new core: a fresh UB with the kernel's buffers (InitUnifiedBuffer). */
    void BeginCore(uint32_t, const CoreRows &)
    {
        ub_ = std::make_unique<UnifiedBuffer>(ubBytes_);
        UbBuffers bytes;
        UbBytesOfTile(tiling_.sp, tiling_.hDim, tiling_.goElemBytes, tiling_.tileLength, &bytes);
        lseIn_ = ub_->Allocate(bytes.lseIn, kBufferNum);
        goIn_ = ub_->Allocate(bytes.goIn, kBufferNum);
        outQueue_ = ub_->Allocate(bytes.out, kBufferNum);
        lseOutQueue_ = ub_->Allocate(bytes.lseOut, kBufferNum);
        lseMax_ = ub_->Allocate(bytes.lseMax, 1);
        total_ = ub_->Allocate(bytes.lseSum, 1);
        weights_ = ub_->Allocate(bytes.weights, 1);
        if (sizeof(GoT) != sizeof(float)) {
            goFloat_ = ub_->Allocate(bytes.goFloat, 1);
            acc_ = ub_->Allocate(bytes.acc, 1);
        }
    }

    void Tile(const CoreRows &core, uint32_t progress, uint32_t rows)
    {
        const uint32_t copy = progress % kBufferNum;  // the queue buffer this tile gets
        CopyIn(core.start, progress, rows, copy);
        ComputeScales(copy, AlignedRows(rows));
        AccumulateShards(copy, rows);
        CopyOut(core.start, progress, rows, copy);
    }

private:
    void CopyIn(uint32_t coreStart, uint32_t progress, uint32_t rows, uint32_t copy)
    {
        const uint32_t lanes = AlignedRows(rows);
        const uint64_t goCount = static_cast<uint64_t>(rows) * tiling_.hDim;
        for (uint32_t shard = 0; shard < tiling_.sp; ++shard) {
            float *lseLocal = ub_->Get<float>(lseIn_, copy, LseLocalOffset(tiling_, shard), lanes);
            std::memcpy(lseLocal, lseGm_ + LseGmOffset(tiling_, shard, coreStart, progress),
                        rows * sizeof(float));
            std::fill(lseLocal + rows, lseLocal + lanes, 0.0f);  // DataCopyPad's padding
            GoT *goLocal = ub_->Get<GoT>(goIn_, copy, GoLocalOffset(tiling_, shard), goCount);
            std::memcpy(goLocal, goGm_ + GoGmOffset(tiling_, shard, coreStart, progress),
                        goCount * sizeof(GoT));
        }
    }

    float *LseShard(uint32_t copy, uint32_t shard, uint32_t lanes)
    {
        return ub_->Get<float>(lseIn_, copy, LseLocalOffset(tiling_, shard), lanes);
    }

    float *WeightShard(uint32_t shard, uint32_t lanes)
    {
        return ub_->Get<float>(weights_, 0, LseLocalOffset(tiling_, shard), lanes);
    }

    /** The kernel's ComputeScales, lane by lane. */
    void ComputeScales(uint32_t copy, uint32_t lanes)
    {
        float *lseMax = ub_->Get<float>(lseMax_, 0, 0, lanes);
        float *total = ub_->Get<float>(total_, 0, 0, lanes);
        float *lseOut = ub_->Get<float>(lseOutQueue_, copy, 0, lanes);
        std::copy(LseShard(copy, 0, lanes), LseShard(copy, 0, lanes) + lanes, lseMax);
        for (uint32_t shard = 1; shard < tiling_.sp; ++shard) {
            const float *lse = LseShard(copy, shard, lanes);
            for (uint32_t lane = 0; lane < lanes; ++lane) {
                lseMax[lane] = std::max(lseMax[lane], lse[lane]);
            }
        }
        for (uint32_t lane = 0; lane < lanes; ++lane) {
            lseMax[lane] = std::max(lseMax[lane], kLowestFloat);
        }
        for (uint32_t shard = 0; shard < tiling_.sp; ++shard) {
            const float *lse = LseShard(copy, shard, lanes);
            float *weights = WeightShard(shard, lanes);
            for (uint32_t lane = 0; lane < lanes; ++lane) {
                weights[lane] = std::exp(lse[lane] - lseMax[lane]);
            }
        }
        std::copy(WeightShard(0, lanes), WeightShard(0, lanes) + lanes, total);
        for (uint32_t shard = 1; shard < tiling_.sp; ++shard) {
            const float *weights = WeightShard(shard, lanes);
            for (uint32_t lane = 0; lane < lanes; ++lane) {
                total[lane] += weights[lane];
            }
        }
        for (uint32_t lane = 0; lane < lanes; ++lane) {
            lseOut[lane] = std::log(total[lane]) + lseMax[lane];
            total[lane] = std::max(total[lane], kSmallestNormalFloat);
        }
        for (uint32_t shard = 0; shard < tiling_.sp; ++shard) {
            float *weights = WeightShard(shard, lanes);
            for (uint32_t lane = 0; lane < lanes; ++lane) {
                weights[lane] /= total[lane];
            }
        }
    }

    /** The fp32 sum: the output tile for fp32 (as in the kernel), else the acc buffer. */
    float *Accumulator(uint32_t copy, uint64_t count)
    {
        if (sizeof(GoT) == sizeof(float)) {
            return ub_->Get<float>(outQueue_, copy, 0, count);
        }
        return ub_->Get<float>(acc_, 0, 0, count);
    }

    /** Shard `shard` of the go tile as fp32 (the kernel's ShardAsFloat). */
    const float *ShardAsFloat(uint32_t copy, uint32_t shard, uint64_t count)
    {
        const GoT *go = ub_->Get<GoT>(goIn_, copy, GoLocalOffset(tiling_, shard), count);
        if (sizeof(GoT) == sizeof(float)) {
            return reinterpret_cast<const float *>(go);
        }
        float *values = ub_->Get<float>(goFloat_, 0, 0, count);
        std::transform(go, go + count, values, Codec::ToFloat);
        return values;
    }

    void AccumulateShards(uint32_t copy, uint32_t rows)
    {
        const uint32_t hDim = tiling_.hDim;
        const uint64_t count = static_cast<uint64_t>(rows) * hDim;
        float *acc = Accumulator(copy, count);
        std::fill(acc, acc + count, 0.0f);
        for (uint32_t shard = 0; shard < tiling_.sp; ++shard) {
            const float *values = ShardAsFloat(copy, shard, count);
            const float *scales = WeightShard(shard, AlignedRows(rows));
            for (uint32_t row = 0; row < rows; ++row) {
                if (scales[row] > 0.0f) {  // Axpy(acc[row], values[row], scale, hDim)
                    for (uint32_t col = 0; col < hDim; ++col) {
                        const float product = values[row * hDim + col] * scales[row];
                        acc[row * hDim + col] += product;
                    }
                }
            }
        }
        if (sizeof(GoT) != sizeof(float)) {
            GoT *out = ub_->Get<GoT>(outQueue_, copy, 0, count);
            std::transform(acc, acc + count, out, Codec::FromFloat);
        }
    }

    void CopyOut(uint32_t coreStart, uint32_t progress, uint32_t rows, uint32_t copy)
    {
        const uint64_t count = static_cast<uint64_t>(rows) * tiling_.hDim;
        const GoT *out = ub_->Get<GoT>(outQueue_, copy, 0, count);
        std::memcpy(outGm_ + OutGmOffset(tiling_, coreStart, progress), out, count * sizeof(GoT));
        if (tiling_.updateType == 1) {
            const float *lseOut = ub_->Get<float>(lseOutQueue_, copy, 0, rows);
            std::memcpy(lseOutGm_ + LseOutGmOffset(tiling_, coreStart, progress), lseOut,
                        rows * sizeof(float));
        }
    }

    AttentionUpdateTiling tiling_;
    uint64_t ubBytes_;
    const float *lseGm_;
    const GoT *goGm_;
    GoT *outGm_;
    float *lseOutGm_;
    std::unique_ptr<UnifiedBuffer> ub_;
    UnifiedBuffer::Slot lseIn_, goIn_, outQueue_, lseOutQueue_, lseMax_, total_, weights_,
        goFloat_, acc_;
};

template <typename Codec>
void RunTwin(const AttentionUpdateTiling &tiling, uint64_t ubBytes, const float *lse,
             const void *go, void *out, float *lseOut)
{
    using GoT = typename Codec::Storage;
    TwinKernel<Codec> kernel(tiling, ubBytes, lse, static_cast<const GoT *>(go),
                             static_cast<GoT *>(out), lseOut);
    WalkTiles(tiling, kernel);
}

thread_local std::string lastError;

}  // namespace
}  // namespace npu_ext_au

using npu_ext_au::AttentionUpdateTiling;

extern "C" {

/** go dtype codes of npu_ext_au_twin_run. */
enum TwinGoDtype { kTwinFloat32 = 0, kTwinFloat16 = 1, kTwinBFloat16 = 2 };
/** Return codes beyond the TilingStatus values (0..7). */
enum TwinError { kTwinBadDtype = 64, kTwinKernelFault = 65 };

/** The kernel's tiling for these inputs; returns the TilingStatus value. */
int npu_ext_au_twin_tiling(uint64_t sp, uint64_t totalLength, uint64_t hDim, uint32_t goElemBytes,
                           uint32_t updateType, uint32_t coreNum, uint64_t ubBytes,
                           AttentionUpdateTiling *tiling)
{
    return static_cast<int>(npu_ext_au::ComputeTiling(
        sp, totalLength, hDim, goElemBytes, updateType, coreNum, ubBytes, tiling));
}

/**
 * Run the twin on contiguous host arrays: lse fp32 [sp, N], go [sp, N, D] (fp32, or fp16/bf16
 * bits), out [N, D] like go, lseOut fp32 [N] (written only when updateType == 1).
 * Returns 0, a TilingStatus value, or a TwinError (message in npu_ext_au_twin_last_error).
 */
int npu_ext_au_twin_run(const float *lse, const void *go, void *out, float *lseOut, uint32_t sp,
                        uint32_t totalLength, uint32_t hDim, int32_t goDtype, uint32_t updateType,
                        uint32_t coreNum, uint64_t ubBytes)
{
    namespace au = npu_ext_au;
    if (goDtype < kTwinFloat32 || goDtype > kTwinBFloat16) {
        return kTwinBadDtype;
    }
    AttentionUpdateTiling tiling{};
    const uint32_t elemBytes = goDtype == kTwinFloat32 ? 4 : 2;
    const int status = npu_ext_au_twin_tiling(sp, totalLength, hDim, elemBytes, updateType,
                                              coreNum, ubBytes, &tiling);
    if (status != 0) {
        return status;
    }
    try {
        if (goDtype == kTwinFloat32) {
            au::RunTwin<au::Float32Codec>(tiling, ubBytes, lse, go, out, lseOut);
        } else if (goDtype == kTwinFloat16) {
            au::RunTwin<au::Float16Codec>(tiling, ubBytes, lse, go, out, lseOut);
        } else {
            au::RunTwin<au::BFloat16Codec>(tiling, ubBytes, lse, go, out, lseOut);
        }
    } catch (const std::exception &error) {
        au::lastError = error.what();
        return kTwinKernelFault;
    }
    return 0;
}

const char *npu_ext_au_twin_last_error()
{
    return npu_ext_au::lastError.c_str();
}

}  // extern "C"
