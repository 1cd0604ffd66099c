/**
 * Shape and dtype inference of NpuExtAttentionUpdate. Unknown dims (-1) propagate as they
 * are, so the same functions serve dynamic-shape graphs.
 */
#include "npu_ext_attention_update_infershape.h"

#include "npu_ext_attention_update_io.h"

namespace ge {

using npu_ext_au::kGoIndex;
using npu_ext_au::kGoRank;
using npu_ext_au::kLseIndex;
using npu_ext_au::kLseOutIndex;
using npu_ext_au::kLseRank;
using npu_ext_au::kOutIndex;

graphStatus NpuExtAttentionUpdateInferShape(gert::InferShapeContext *context)
{
    const gert::Shape *lse = context->GetInputShape(kLseIndex);
    const gert::Shape *go = context->GetInputShape(kGoIndex);
    gert::Shape *out = context->GetOutputShape(kOutIndex);
    gert::Shape *lseOut = context->GetOutputShape(kLseOutIndex);
    if (lse == nullptr || go == nullptr || out == nullptr || lseOut == nullptr) {
        return GRAPH_FAILED;
    }
    if (lse->GetDimNum() != kLseRank || go->GetDimNum() != kGoRank) {
        return GRAPH_FAILED;
    }
    out->SetDimNum(2);
    out->SetDim(0, go->GetDim(1));  // N
    out->SetDim(1, go->GetDim(2));  // D
    lseOut->SetDimNum(1);
    lseOut->SetDim(0, lse->GetDim(1));  // N
    return GRAPH_SUCCESS;
}

graphStatus NpuExtAttentionUpdateInferDataType(gert::InferDataTypeContext *context)
{
    context->SetOutputDataType(kOutIndex, context->GetInputDataType(kGoIndex));
    context->SetOutputDataType(kLseOutIndex, DT_FLOAT);
    return GRAPH_SUCCESS;
}

}  // namespace ge
