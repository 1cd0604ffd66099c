/**
 * Operator definition of NpuExtAttentionUpdate, the renamed, tensor-input AttentionUpdate.
 *
 * Unlike CANN's AttentionUpdate (DYNAMIC tensor-list inputs, sp as an attribute), lse and go
 * are single REQUIRED tensors and sp is lse's dim 0:
 *   inputs   lse      fp32            [sp, N]
 *            go       fp32/fp16/bf16  [sp, N, D]
 *   attr     update_type int          1: also write lse_out
 *   outputs  out      go's dtype      [N, D]
 *            lse_out  fp32            [N]
 * The op type is our own so that no same-named operator earlier on ASCEND_CUSTOM_OPP_PATH
 * (vllm-ascend's bundled ops, CANN's built-ins) can shadow it.
 */
#include "npu_ext_attention_update_infershape.h"
#include "npu_ext_attention_update_tiling.h"
#include "register/op_def_registry.h"

namespace ops {

class NpuExtAttentionUpdate : public OpDef {
public:
    explicit NpuExtAttentionUpdate(const char *name) : OpDef(name)
    {
        // Column k of every DataType list is one supported combination.
        this->Input("lse")
            .ParamType(REQUIRED)
            .DataType({ge::DT_FLOAT, ge::DT_FLOAT, ge::DT_FLOAT})
            .Format({ge::FORMAT_ND, ge::FORMAT_ND, ge::FORMAT_ND})
            .UnknownShapeFormat({ge::FORMAT_ND, ge::FORMAT_ND, ge::FORMAT_ND});
        this->Input("go")
            .ParamType(REQUIRED)
            .DataType({ge::DT_FLOAT, ge::DT_FLOAT16, ge::DT_BF16})
            .Format({ge::FORMAT_ND, ge::FORMAT_ND, ge::FORMAT_ND})
            .UnknownShapeFormat({ge::FORMAT_ND, ge::FORMAT_ND, ge::FORMAT_ND});
        this->Output("out")
            .ParamType(REQUIRED)
            .DataType({ge::DT_FLOAT, ge::DT_FLOAT16, ge::DT_BF16})
            .Format({ge::FORMAT_ND, ge::FORMAT_ND, ge::FORMAT_ND})
            .UnknownShapeFormat({ge::FORMAT_ND, ge::FORMAT_ND, ge::FORMAT_ND});
        this->Output("lse_out")
            .ParamType(REQUIRED)
            .DataType({ge::DT_FLOAT, ge::DT_FLOAT, ge::DT_FLOAT})
            .Format({ge::FORMAT_ND, ge::FORMAT_ND, ge::FORMAT_ND})
            .UnknownShapeFormat({ge::FORMAT_ND, ge::FORMAT_ND, ge::FORMAT_ND});
        this->Attr("update_type").AttrType(REQUIRED).Int();

        this->SetInferShape(ge::NpuExtAttentionUpdateInferShape)
            .SetInferDataType(ge::NpuExtAttentionUpdateInferDataType);
        this->AICore().SetTiling(optiling::NpuExtAttentionUpdateTiling);
        this->AICore().AddConfig("ascend910b");
        this->AICore().AddConfig("ascend910_93");
    }
};

OP_ADD(NpuExtAttentionUpdate);

}  // namespace ops
