/**
 * aclnn API of NpuExtAttentionUpdate (the renamed, tensor-input AttentionUpdate).
 *
 * Two-phase call, as every aclnn operator:
 *   aclnnNpuExtAttentionUpdateGetWorkspaceSize(lse, go, updateType, out, lseOut,
 *                                              &workspaceSize, &executor);
 *   aclnnNpuExtAttentionUpdate(workspace, workspaceSize, executor, stream);
 *
 * lse     fp32 [sp, N]                 sp in 1..16
 * go      fp32/fp16/bf16 [sp, N, D]    D in 8..512, a multiple of 8
 * updateType  0 or 1
 * out     go's dtype [N, D]
 * lseOut  fp32 [N]; required when updateType == 1 (the merged lse is written to it),
 *         ignored (may be nullptr) when updateType == 0.
 * Strided inputs are accepted: each is made contiguous once, as a whole.
 */
#ifndef ACLNN_NPU_EXT_ATTENTION_UPDATE_H
#define ACLNN_NPU_EXT_ATTENTION_UPDATE_H

#include "aclnn/aclnn_base.h"

#ifdef __cplusplus
extern "C" {
#endif

__attribute__((visibility("default"))) aclnnStatus aclnnNpuExtAttentionUpdateGetWorkspaceSize(
    const aclTensor *lse, const aclTensor *go, int64_t updateType, aclTensor *out,
    aclTensor *lseOut, uint64_t *workspaceSize, aclOpExecutor **executor);

__attribute__((visibility("default"))) aclnnStatus aclnnNpuExtAttentionUpdate(
    void *workspace, uint64_t workspaceSize, aclOpExecutor *executor, aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif  // ACLNN_NPU_EXT_ATTENTION_UPDATE_H
