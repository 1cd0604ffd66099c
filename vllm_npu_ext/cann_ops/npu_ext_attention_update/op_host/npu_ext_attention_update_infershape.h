/**
 * Shape and dtype inference of NpuExtAttentionUpdate (used by GE graphs and by the aclnn
 * INFER_SHAPE step):
 *   lse fp32 [sp, N], go T [sp, N, D]  ->  out T [N, D], lse_out fp32 [N]
 */
#ifndef NPU_EXT_ATTENTION_UPDATE_INFERSHAPE_H
#define NPU_EXT_ATTENTION_UPDATE_INFERSHAPE_H

#include "register/op_impl_registry.h"

namespace ge {

graphStatus NpuExtAttentionUpdateInferShape(gert::InferShapeContext *context);
graphStatus NpuExtAttentionUpdateInferDataType(gert::InferDataTypeContext *context);

}  // namespace ge

#endif  // NPU_EXT_ATTENTION_UPDATE_INFERSHAPE_H
