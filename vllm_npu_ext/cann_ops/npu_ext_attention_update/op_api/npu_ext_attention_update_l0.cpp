/**
 * Level-0 API of NpuExtAttentionUpdate: allocate the outputs, infer their shapes with the
 * op_host infershape, and queue the AI-core kernel with its tiling.
 */
#include "npu_ext_attention_update_l0.h"

#include "opdev/make_op_executor.h"
#include "opdev/op_def.h"
#include "opdev/op_dfx.h"
#include "opdev/op_log.h"

namespace l0op {

OP_TYPE_REGISTER(NpuExtAttentionUpdate);

NpuExtAttentionUpdateOutputs NpuExtAttentionUpdate(const aclTensor *lse, const aclTensor *go,
                                                   int64_t updateType, aclOpExecutor *executor)
{
    L0_DFX(NpuExtAttentionUpdate, lse, go, updateType);
    const NpuExtAttentionUpdateOutputs failed{nullptr, nullptr};
    aclTensor *out = executor->AllocTensor(go->GetDataType(), op::Format::FORMAT_ND,
                                           op::Format::FORMAT_ND);
    aclTensor *lseOut = executor->AllocTensor(op::DataType::DT_FLOAT, op::Format::FORMAT_ND,
                                              op::Format::FORMAT_ND);
    if (out == nullptr || lseOut == nullptr) {
        OP_LOGE(ACLNN_ERR_INNER_NULLPTR, "NpuExtAttentionUpdate: output allocation failed.");
        return failed;
    }
    aclnnStatus status = INFER_SHAPE(NpuExtAttentionUpdate, OP_INPUT(lse, go),
                                     OP_OUTPUT(out, lseOut), OP_ATTR(updateType));
    if (status != ACLNN_SUCCESS) {
        OP_LOGE(ACLNN_ERR_INNER_INFERSHAPE_ERROR, "NpuExtAttentionUpdate: InferShape failed.");
        return failed;
    }
    status = ADD_TO_LAUNCHER_LIST_AICORE(NpuExtAttentionUpdate, OP_INPUT(lse, go),
                                         OP_OUTPUT(out, lseOut), OP_ATTR(updateType));
    if (status != ACLNN_SUCCESS) {
        OP_LOGE(ACLNN_ERR_INNER_NULLPTR, "NpuExtAttentionUpdate: kernel launch setup failed.");
        return failed;
    }
    return NpuExtAttentionUpdateOutputs{out, lseOut};
}

}  // namespace l0op
