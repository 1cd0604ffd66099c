/**
 * aclnn API of NpuExtAttentionUpdate: parameter checks, one Contiguous per input (the whole
 * [sp, ...] tensor, never per shard: the kernel reaches shard i by stride), the level-0
 * launch, and the copy into the caller's outputs (lseOut only when updateType == 1).
 *
 * The limits come from op_kernel/attention_update_tiling_math.h, the header the tiling and
 * the kernel use, so the three layers cannot disagree.
 */
#include "aclnn_npu_ext_attention_update.h"

#include "aclnn_kernels/contiguous.h"
#include "attention_update_tiling_math.h"
#include "npu_ext_attention_update_l0.h"
#include "opdev/common_types.h"
#include "opdev/make_op_executor.h"
#include "opdev/op_dfx.h"
#include "opdev/op_executor.h"
#include "opdev/op_log.h"

namespace {

namespace limits = npu_ext_au;

constexpr size_t kLseRank = 2;  // [sp, N]
constexpr size_t kGoRank = 3;   // [sp, N, D]

bool IsGoDtype(op::DataType dtype)
{
    return dtype == op::DataType::DT_FLOAT || dtype == op::DataType::DT_FLOAT16 ||
           dtype == op::DataType::DT_BF16;
}

aclnnStatus CheckNotNull(const aclTensor *lse, const aclTensor *go, int64_t updateType,
                         const aclTensor *out, const aclTensor *lseOut)
{
    if (lse == nullptr || go == nullptr || out == nullptr) {
        OP_LOGE(ACLNN_ERR_PARAM_NULLPTR, "lse, go and out must not be null.");
        return ACLNN_ERR_PARAM_NULLPTR;
    }
    if (updateType == 1 && lseOut == nullptr) {
        OP_LOGE(ACLNN_ERR_PARAM_NULLPTR, "lseOut must not be null when updateType is 1.");
        return ACLNN_ERR_PARAM_NULLPTR;
    }
    return ACLNN_SUCCESS;
}

bool CheckDtypes(const aclTensor *lse, const aclTensor *go, int64_t updateType,
                 const aclTensor *out, const aclTensor *lseOut)
{
    CHECK_COND(updateType == 0 || updateType == 1, false, "updateType must be 0 or 1, got %ld.",
               updateType);
    CHECK_COND(lse->GetDataType() == op::DataType::DT_FLOAT, false, "lse must be float32.");
    CHECK_COND(IsGoDtype(go->GetDataType()), false, "go must be float32, float16 or bfloat16.");
    CHECK_COND(out->GetDataType() == go->GetDataType(), false, "out must have go's dtype.");
    CHECK_COND(updateType == 0 || lseOut->GetDataType() == op::DataType::DT_FLOAT, false,
               "lseOut must be float32.");
    return true;
}

/** lse [sp, N] and go [sp, N, D] with sp, N and D in range. */
bool CheckInputShapes(const op::Shape &lse, const op::Shape &go)
{
    CHECK_COND(lse.GetDimNum() == kLseRank, false, "lse must be 2-D [sp, N], got %zu dims.",
               lse.GetDimNum());
    CHECK_COND(go.GetDimNum() == kGoRank, false, "go must be 3-D [sp, N, D], got %zu dims.",
               go.GetDimNum());
    const int64_t sp = lse.GetDim(0);
    const int64_t rows = lse.GetDim(1);
    const int64_t headDim = go.GetDim(2);
    CHECK_COND(sp >= limits::kMinSp && sp <= limits::kMaxSp, false,
               "lse: sp (dim 0) must be in %u..%u, got %ld.", limits::kMinSp, limits::kMaxSp, sp);
    CHECK_COND(go.GetDim(0) == sp && go.GetDim(1) == rows, false,
               "go must be [sp, N, D] = [%ld, %ld, D] to match lse, got [%ld, %ld, %ld].", sp,
               rows, go.GetDim(0), go.GetDim(1), headDim);
    CHECK_COND(headDim >= limits::kMinHeadDim && headDim <= limits::kMaxHeadDim &&
                   headDim % limits::kHeadDimMultiple == 0,
               false, "go: D (dim 2) must be in %u..%u and a multiple of %u, got %ld.",
               limits::kMinHeadDim, limits::kMaxHeadDim, limits::kHeadDimMultiple, headDim);
    CHECK_COND(rows >= 0 && static_cast<uint64_t>(rows) <= limits::kMaxTotalLength, false,
               "lse: N (dim 1) must be in 0..%lu, got %ld.", limits::kMaxTotalLength, rows);
    return true;
}

/** out [N, D]; lseOut [N] when it will be written. */
bool CheckOutputShapes(const op::Shape &go, int64_t updateType, const aclTensor *out,
                       const aclTensor *lseOut)
{
    const op::Shape outShape = out->GetViewShape();
    CHECK_COND(outShape.GetDimNum() == 2 && outShape.GetDim(0) == go.GetDim(1) &&
                   outShape.GetDim(1) == go.GetDim(2),
               false, "out must be [N, D] = [%ld, %ld].", go.GetDim(1), go.GetDim(2));
    if (updateType == 1) {
        const op::Shape lseOutShape = lseOut->GetViewShape();
        CHECK_COND(lseOutShape.GetDimNum() == 1 && lseOutShape.GetDim(0) == go.GetDim(1), false,
                   "lseOut must be [N] = [%ld].", go.GetDim(1));
    }
    return true;
}

aclnnStatus CheckParams(const aclTensor *lse, const aclTensor *go, int64_t updateType,
                        const aclTensor *out, const aclTensor *lseOut)
{
    const aclnnStatus nullStatus = CheckNotNull(lse, go, updateType, out, lseOut);
    CHECK_RET(nullStatus == ACLNN_SUCCESS, nullStatus);
    CHECK_RET(CheckDtypes(lse, go, updateType, out, lseOut), ACLNN_ERR_PARAM_INVALID);
    const op::Shape goShape = go->GetViewShape();
    CHECK_RET(CheckInputShapes(lse->GetViewShape(), goShape), ACLNN_ERR_PARAM_INVALID);
    CHECK_RET(CheckOutputShapes(goShape, updateType, out, lseOut), ACLNN_ERR_PARAM_INVALID);
    return ACLNN_SUCCESS;
}

}  // namespace

#ifdef __cplusplus
extern "C" {
#endif

aclnnStatus aclnnNpuExtAttentionUpdateGetWorkspaceSize(const aclTensor *lse, const aclTensor *go,
                                                       int64_t updateType, aclTensor *out,
                                                       aclTensor *lseOut, uint64_t *workspaceSize,
                                                       aclOpExecutor **executor)
{
    CHECK_COND(workspaceSize != nullptr && executor != nullptr, ACLNN_ERR_PARAM_NULLPTR,
               "workspaceSize and executor must not be null.");
    L2_DFX_PHASE_1(aclnnNpuExtAttentionUpdate, DFX_IN(lse, go, updateType), DFX_OUT(out, lseOut));
    auto uniqueExecutor = CREATE_EXECUTOR();
    CHECK_RET(uniqueExecutor.get() != nullptr, ACLNN_ERR_INNER_CREATE_EXECUTOR);
    const aclnnStatus status = CheckParams(lse, go, updateType, out, lseOut);
    CHECK_RET(status == ACLNN_SUCCESS, status);

    if (lse->IsEmpty()) {  // N == 0: nothing to merge, nothing to launch
        *workspaceSize = 0;
        uniqueExecutor.ReleaseTo(executor);
        return ACLNN_SUCCESS;
    }
    const aclTensor *lseContiguous = l0op::Contiguous(lse, uniqueExecutor.get());
    const aclTensor *goContiguous = l0op::Contiguous(go, uniqueExecutor.get());
    CHECK_RET(lseContiguous != nullptr && goContiguous != nullptr, ACLNN_ERR_INNER_NULLPTR);

    const l0op::NpuExtAttentionUpdateOutputs results = l0op::NpuExtAttentionUpdate(
        lseContiguous, goContiguous, updateType, uniqueExecutor.get());
    CHECK_RET(results.out != nullptr && results.lseOut != nullptr, ACLNN_ERR_INNER_NULLPTR);
    CHECK_RET(l0op::ViewCopy(results.out, out, uniqueExecutor.get()) != nullptr,
              ACLNN_ERR_INNER_NULLPTR);
    if (updateType == 1) {
        CHECK_RET(l0op::ViewCopy(results.lseOut, lseOut, uniqueExecutor.get()) != nullptr,
                  ACLNN_ERR_INNER_NULLPTR);
    }

    *workspaceSize = uniqueExecutor->GetWorkspaceSize();
    uniqueExecutor.ReleaseTo(executor);
    return ACLNN_SUCCESS;
}

aclnnStatus aclnnNpuExtAttentionUpdate(void *workspace, uint64_t workspaceSize,
                                       aclOpExecutor *executor, aclrtStream stream)
{
    L2_DFX_PHASE_2(aclnnNpuExtAttentionUpdate);
    return CommonOpExecutorRun(workspace, workspaceSize, executor, stream);
}

#ifdef __cplusplus
}
#endif
