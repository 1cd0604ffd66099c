/**
 * Level-0 (single kernel launch) API of NpuExtAttentionUpdate, used by the aclnn layer.
 * Inputs must already be contiguous: lse fp32 [sp, N], go [sp, N, D].
 */
#ifndef NPU_EXT_ATTENTION_UPDATE_L0_H
#define NPU_EXT_ATTENTION_UPDATE_L0_H

#include "opdev/op_executor.h"

namespace l0op {

struct NpuExtAttentionUpdateOutputs {
    const aclTensor *out;     // go's dtype [N, D]
    const aclTensor *lseOut;  // fp32 [N]; only written by the kernel when updateType == 1
};

/** Queues one kernel launch on `executor`; both outputs are nullptr on failure. */
NpuExtAttentionUpdateOutputs NpuExtAttentionUpdate(const aclTensor *lse, const aclTensor *go,
                                                   int64_t updateType, aclOpExecutor *executor);

}  // namespace l0op

#endif  // NPU_EXT_ATTENTION_UPDATE_L0_H
