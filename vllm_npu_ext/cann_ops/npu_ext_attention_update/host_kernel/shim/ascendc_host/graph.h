/**
 * The subset of CANN's graph types (ge::, gert::, fe::) that an op_host tiling function uses,
 * so that op_host's npu_ext_attention_update_tiling.cpp compiles unchanged and runs on the
 * host: a TilingContext with input shapes and dtypes, attributes, platform information,
 * the raw tiling buffer, the tiling key, block dim and workspace sizes. The launcher
 * (host_kernel/launch.cpp) fills it as CANN would for one launch and reads back what the
 * tiling function set.
 */
#ifndef ASCENDC_HOST_GRAPH_H
#define ASCENDC_HOST_GRAPH_H

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ge {

using graphStatus = uint32_t;
constexpr graphStatus GRAPH_SUCCESS = 0;
constexpr graphStatus GRAPH_FAILED = 0xFFFFFFFF;

// The values of CANN's ge::DataType for the types the operator takes.
enum DataType { DT_FLOAT = 0, DT_FLOAT16 = 1, DT_INT32 = 3, DT_BF16 = 27 };

}  // namespace ge

namespace fe {

/** What PlatformAscendC reads: the vector core count and each core's memories. */
struct PlatFormInfos {
    uint32_t coreNumAiv = 0;
    uint64_t ubBytes = 0;
    uint32_t libApiWorkspaceBytes = 0;
};

}  // namespace fe

namespace gert {

class Shape {
public:
    Shape() = default;
    explicit Shape(std::vector<int64_t> dims) : dims_(std::move(dims)) {}
    size_t GetDimNum() const { return dims_.size(); }
    int64_t GetDim(size_t index) const { return index < dims_.size() ? dims_[index] : 0; }

private:
    std::vector<int64_t> dims_;
};

/** Origin and storage shape; ND tensors have the same both. */
class StorageShape {
public:
    StorageShape() = default;
    explicit StorageShape(Shape shape) : shape_(std::move(shape)) {}
    const Shape &GetStorageShape() const { return shape_; }
    const Shape &GetOriginShape() const { return shape_; }

private:
    Shape shape_;
};

class CompileTimeTensorDesc {
public:
    explicit CompileTimeTensorDesc(ge::DataType dtype) : dtype_(dtype) {}
    ge::DataType GetDataType() const { return dtype_; }

private:
    ge::DataType dtype_;
};

/** The op's attributes; the operator's only attribute is an int (update_type). */
class RuntimeAttrs {
public:
    explicit RuntimeAttrs(std::vector<int64_t> ints) : ints_(std::move(ints)) {}
    template <typename T>
    const T *GetAttrPointer(size_t index) const
    {
        static_assert(sizeof(T) == sizeof(int64_t), "the host graph shim holds int attributes");
        return index < ints_.size() ? reinterpret_cast<const T *>(&ints_[index]) : nullptr;
    }

private:
    std::vector<int64_t> ints_;
};

class TilingData {
public:
    explicit TilingData(size_t capacity) : bytes_(capacity) {}
    void *GetData() { return bytes_.data(); }
    size_t GetCapacity() const { return bytes_.size(); }
    void SetDataSize(size_t size) { size_ = size; }
    size_t GetDataSize() const { return size_; }

private:
    std::vector<uint8_t> bytes_;
    size_t size_ = 0;
};

class TilingContext {
public:
    TilingContext(std::vector<StorageShape> shapes, std::vector<CompileTimeTensorDesc> descs,
                  RuntimeAttrs attrs, fe::PlatFormInfos platform)
        : shapes_(std::move(shapes)), descs_(std::move(descs)), attrs_(std::move(attrs)),
          platform_(platform)
    {
    }

    const StorageShape *GetInputShape(size_t index) const
    {
        return index < shapes_.size() ? &shapes_[index] : nullptr;
    }
    const CompileTimeTensorDesc *GetInputDesc(size_t index) const
    {
        return index < descs_.size() ? &descs_[index] : nullptr;
    }
    const RuntimeAttrs *GetAttrs() const { return &attrs_; }
    fe::PlatFormInfos *GetPlatformInfo() { return &platform_; }
    TilingData *GetRawTilingData() { return &tiling_; }
    void SetTilingKey(uint64_t key) { tilingKey_ = key; }
    uint64_t GetTilingKey() const { return tilingKey_; }
    void SetBlockDim(uint32_t blockDim) { blockDim_ = blockDim; }
    uint32_t GetBlockDim() const { return blockDim_; }
    size_t *GetWorkspaceSizes(size_t count)
    {
        workspaces_.assign(count, 0);
        return workspaces_.data();
    }
    const std::vector<size_t> &Workspaces() const { return workspaces_; }

private:
    std::vector<StorageShape> shapes_;
    std::vector<CompileTimeTensorDesc> descs_;
    RuntimeAttrs attrs_;
    fe::PlatFormInfos platform_;
    TilingData tiling_{4096};
    uint64_t tilingKey_ = 0;
    uint32_t blockDim_ = 0;
    std::vector<size_t> workspaces_;
};

}  // namespace gert

#endif  // ASCENDC_HOST_GRAPH_H
