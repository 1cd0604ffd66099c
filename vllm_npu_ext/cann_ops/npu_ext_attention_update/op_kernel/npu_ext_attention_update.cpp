/**
 * Kernel entry of NpuExtAttentionUpdate. The file name is the snake_case of the op type, as
 * the CANN op build expects; the tiling key chooses go's dtype (op_host tiling sets it).
 *
 *   lse fp32 [sp, N], go [sp, N, D]  ->  out [N, D] (go's dtype), lse_out fp32 [N]
 */
#include "kernel_operator.h"
#include "npu_ext_attention_update_kernel.h"

using npu_ext_au::AttentionUpdateKernel;
using npu_ext_au::AttentionUpdateTiling;

namespace {

template <typename GoT, typename TilingData>
__aicore__ inline void Run(GM_ADDR lse, GM_ADDR go, GM_ADDR out, GM_ADDR lseOut,
                           const TilingData &data)
{
    AttentionUpdateTiling tiling;
    tiling.sp = data.sp;
    tiling.totalLength = data.totalLength;
    tiling.hDim = data.hDim;
    tiling.goElemBytes = data.goElemBytes;
    tiling.updateType = data.updateType;
    tiling.usedCoreNum = data.usedCoreNum;
    tiling.formerNum = data.formerNum;
    tiling.formerLength = data.formerLength;
    tiling.tailLength = data.tailLength;
    tiling.tileLength = data.tileLength;
    AttentionUpdateKernel<GoT> kernel;
    kernel.Init(lse, go, out, lseOut, tiling);
    kernel.Process();
}

}  // namespace

extern "C" __global__ __aicore__ void npu_ext_attention_update(GM_ADDR lse, GM_ADDR go, GM_ADDR out,
                                                               GM_ADDR lse_out, GM_ADDR workspace,
                                                               GM_ADDR tiling)
{
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
    GET_TILING_DATA(tilingData, tiling);
    // Keys are literals: the op build scans TILING_KEY_IS(<n>) to compile one binary per key.
    // They must match kTilingKey* in op_host/npu_ext_attention_update_tiling.cpp.
    if (TILING_KEY_IS(1)) {
        Run<float>(lse, go, out, lse_out, tilingData);
    } else if (TILING_KEY_IS(2)) {
        Run<half>(lse, go, out, lse_out, tilingData);
    } else if (TILING_KEY_IS(3)) {
        Run<bfloat16_t>(lse, go, out, lse_out, tilingData);
    }
}
